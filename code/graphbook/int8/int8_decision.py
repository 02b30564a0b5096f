"""Choosing an INT8 configuration from the recorded matrix, by data (Chapter 4)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from graphbook.record import recording, results, runs as recorded_runs
from graphbook.int8.int8_matrix import FP32_NAME, KIND_MATRIX, KIND_TENSOR_ERRORS
from graphbook.int8.quantization import Int8MatrixError, node_group


def _is_true(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) if value == value else False  # NaN -> False


def recommend_int8_config(frame, *, latency_budget_ms: float | None = None, max_rate_drop: float = 0.02,
                          max_error_increase_px: float = 0.25, rate_tolerance: float | None = None,
                          error_tolerance_px: float = 0.05) -> dict:
    """The fastest INT8 configuration as accurate as the best within the latency budget, or FP32 and why: ``chosen``
    and ``fp32`` (rows), ``keep_fp32`` ("" or the reason), the counts ``int8``, ``within_budget`` and
    ``as_accurate``, the ``runner_up`` row and whether it ``ties`` (its fastest run within the chosen's slowest). The
    0.05 px tolerance is the decoder's sub-pixel noise, not quantization."""
    frame = pd.DataFrame(frame).reset_index(drop=True)
    fp32 = frame[frame["precision"] == "fp32"].iloc[0]
    ok = frame[(frame["precision"] == "int8") & (frame["status"].astype(str) == "ok")]
    ok = ok[ok["latency_ms"].notna() & ok["detection_rate"].notna()]
    budget = float(fp32["latency_ms"]) if latency_budget_ms is None else float(latency_budget_ms)
    within = ok[ok["latency_ms"] <= budget]
    record = {"fp32": fp32, "chosen": fp32, "keep_fp32": "", "budget_ms": budget, "runner_up": None, "ties": False,
              "int8": int((frame["precision"] == "int8").sum()), "within_budget": len(within), "as_accurate": 0}
    if within.empty:
        return {**record, "keep_fp32": "no INT8 configuration ran" if ok.empty else "none within the latency budget"}
    visible = float(fp32.get("visible_frames", float("nan")))
    if rate_tolerance is None:
        rate_tolerance = 1.0 / visible if visible == visible and visible > 0 else 0.0
    accurate = within[within["detection_rate"] >= float(within["detection_rate"].max()) - rate_tolerance - 1e-12]
    best_error = float(accurate["median_error_px"].min())
    if best_error == best_error:  # a NaN error (no hit at all) leaves the detection rate to decide
        accurate = accurate[accurate["median_error_px"] <= best_error + error_tolerance_px + 1e-12]
    ranked = accurate.sort_values(["latency_ms", "median_error_px"], na_position="last")
    chosen = ranked.iloc[0]
    record.update(chosen=chosen, as_accurate=len(accurate))
    if (float(fp32["detection_rate"]) - float(chosen["detection_rate"]) > max_rate_drop
            or float(chosen["median_error_px"]) - float(fp32["median_error_px"]) > max_error_increase_px):
        return {**record, "chosen": fp32, "keep_fp32": "the best INT8 configuration loses accuracy"}
    if len(ranked) > 1:
        runner = ranked.iloc[1]
        ties = ({"latency_min_ms", "latency_max_ms"} <= set(ranked.columns)
                and float(runner["latency_min_ms"]) <= float(chosen["latency_max_ms"]))
        record.update(runner_up=runner, ties=bool(ties))
    return record


def tensor_error_groups(frame) -> dict:
    """A recorded worst-tensor ranking in facts: the layer groups of the worst activations (counts), the worst one's
    row, and the worst weights' SQNR range in dB."""
    frame = pd.DataFrame(frame)
    acts = frame[frame["tensor_kind"] == "activation"].sort_values("rank")
    weights = frame[frame["tensor_kind"] == "weight"]
    recorded = acts["group"] if "group" in acts else pd.Series([None] * len(acts), index=acts.index)
    derived = acts["module"].fillna("").map(lambda m: node_group(["", str(m)]) or "other")  # runs before "group"
    groups = recorded.where(recorded.notna() & (recorded.astype(str) != ""), derived).value_counts()
    return {"activations": len(acts), "groups": groups.to_dict(), "worst": acts.iloc[0],
            "weight_sqnr_db": (float(weights["sqnr_db"].min()), float(weights["sqnr_db"].max())) if len(weights)
            else None}


def latest_tensor_errors(results_dir: str | Path | None = None):
    return _latest(KIND_TENSOR_ERRORS, results_dir)


def _recorded(kind_name: str, results_dir):
    frame = recording.load(kind_name) if results_dir is None else results.load(kind_name, results_dir)
    if "smoke" in frame:
        frame = frame[~frame["smoke"].map(_is_true)]
    if frame.empty:
        raise Int8MatrixError(f"no recorded {kind_name} run (smoke runs excluded): run `python code/bench_int8.py`")
    return frame


def _latest(kind_name: str, results_dir):
    return results.latest_run(_recorded(kind_name, results_dir)).reset_index(drop=True)


def _combine_runs(frame):
    """One row per configuration from the newest run's machine and conditions: accuracy from the newest run (it is
    deterministic), latency the median across runs; runs flagged under load set aside while a quiet one remains."""
    framed = recorded_runs.add_machine(pd.DataFrame(frame))
    latest = results.latest_run(framed)
    same = framed[framed[recorded_runs.MACHINE] == latest[recorded_runs.MACHINE].iloc[0]]
    for column in ("height", "width", "eval_clips"):
        if column in same:
            same = same[same[column] == latest[column].iloc[0]]
    timed = same[(same["status"].astype(str) == "ok") & same["latency_ms"].notna()]
    # a run taken under load is set aside (never deleted) when a quiet one of the same machine remains
    flagged = recorded_runs.flag_under_load(timed, value="latency_ms", variant="config", reference=FP32_NAME)
    quiet = flagged[~flagged[recorded_runs.UNDER_LOAD]]
    set_aside = sorted(set(flagged.loc[flagged[recorded_runs.UNDER_LOAD], "run_id"].astype(str)))
    if not quiet.empty:
        timed = quiet.drop(columns=[recorded_runs.UNDER_LOAD, recorded_runs.LOAD_REASON])
    else:
        set_aside = []
    summary = recorded_runs.summarize_runs(timed, by="config", value="latency_ms").set_index("config")
    combined = latest.drop(columns=[recorded_runs.MACHINE]).copy()
    for column, source in (("latency_ms", "median"), ("latency_min_ms", "min"), ("latency_max_ms", "max"),
                           ("runs", "runs")):
        combined[column] = combined["config"].map(summary[source]) if not summary.empty else math.nan
    fp32 = combined.loc[combined["precision"] == "fp32", "latency_ms"]
    if not fp32.empty:
        combined["speedup_vs_fp32"] = float(fp32.iloc[0]) / combined["latency_ms"]
    combined["run_id"] = "+".join(dict.fromkeys(str(r) for r in timed["run_id"]))
    combined["runs_set_aside"] = ", ".join(set_aside)
    return combined.reset_index(drop=True)


def combined_matrix(results_dir: str | Path | None = None):
    """:func:`_combine_runs` over every recorded (non-smoke) run of the matrix."""
    return _combine_runs(_recorded(KIND_MATRIX, results_dir))


def matrix_table(frame):
    """The columns of a matrix run that a chapter shows, FP32 first."""
    columns = [c for c in ("config", "role", "per_channel", "calibration", "histogram_bins", "pre_process",
                           "excluded", "reduce_range", "status", "detection_rate", "median_error_px",
                           "median_angle_error_deg", "max_abs_diff", "latency_ms", "speedup_vs_fp32") if c in frame]
    return frame[columns].reset_index(drop=True)
