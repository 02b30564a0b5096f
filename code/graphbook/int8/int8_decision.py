"""Choosing an INT8 configuration from the recorded matrix, by data, and saying why (Chapter 4)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from graphbook.record import results, runs as recorded_runs
from graphbook.int8.int8_matrix import FP32_NAME, KIND_MATRIX, KIND_TENSOR_ERRORS
from graphbook.int8.quantization import Int8MatrixError, excluded_phrase, node_group


def _is_true(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) if value == value else False  # NaN -> False


def _config_phrase(row) -> str:
    excluded = str(row.get("excluded") or "")
    excluded = "" if excluded.lower() == "nan" else excluded
    bins = row.get("histogram_bins")
    bins = f" ({int(float(bins))} histogram bins)" if bins not in (None, "") and str(bins) != "nan" else ""
    parts = ["per-channel weights" if _is_true(row.get("per_channel")) else "per-tensor weights",
             f"{row.get('calibration')} calibration{bins}",
             *(["quant_pre_process"] if _is_true(row.get("pre_process")) else []),
             excluded_phrase(excluded), f"reduce_range={_is_true(row.get('reduce_range'))}"]
    return ", ".join(parts)


def recommend_int8_config(frame, *, latency_budget_ms: float | None = None, max_rate_drop: float = 0.02,
                          max_error_increase_px: float = 0.25, rate_tolerance: float | None = None,
                          error_tolerance_px: float = 0.05):
    """``(row, sentence)``: the fastest INT8 configuration as accurate as the best within the latency budget, or
    FP32 with the reason. The 0.05 px tolerance is the decoder's sub-pixel noise, not quantization."""
    if frame is None or len(frame) == 0:
        raise Int8MatrixError("no recorded INT8 matrix run: run `python code/bench_int8.py` first")
    frame = pd.DataFrame(frame).reset_index(drop=True)
    if "run_id" in frame and frame["run_id"].nunique() > 1:
        raise Int8MatrixError(f"the frame holds {frame['run_id'].nunique()} runs; pass one "
                              "(latest_matrix or graphbook.record.results.latest_run) so the configurations share "
                              "one machine and load")
    missing = [c for c in ("config", "precision", "status", "detection_rate", "median_error_px", "latency_ms")
               if c not in frame]
    if missing:
        raise Int8MatrixError(f"not an INT8 matrix run: columns {missing} are missing")
    fp32 = frame[frame["precision"] == "fp32"]
    if fp32.empty:
        raise Int8MatrixError("the run has no FP32 reference row to compare with")
    fp32 = fp32.iloc[0]
    ok = frame[(frame["precision"] == "int8") & (frame["status"].astype(str) == "ok")]
    ok = ok[ok["latency_ms"].notna() & ok["detection_rate"].notna()]
    size = f"{int(fp32['height'])}x{int(fp32['width'])}" if "height" in fp32 else "the recorded size"
    threads = f"{int(fp32['threads'])} threads" if "threads" in fp32 else "the recorded threads"
    clips = f"{int(fp32['eval_clips'])} held-out clips" if "eval_clips" in fp32 else "the held-out clips"
    budget = float(fp32["latency_ms"]) if latency_budget_ms is None else float(latency_budget_ms)
    budget_phrase = f"FP32's {budget:.1f} ms" if latency_budget_ms is None else f"{budget:.1f} ms"
    total = int((frame["precision"] == "int8").sum())
    if ok.empty:
        return fp32, (f"Keep FP32: none of the {total} INT8 configurations ran here, so there is nothing to "
                      f"trade its detection rate of {fp32['detection_rate']:.1%} for.")
    within = ok[ok["latency_ms"] <= budget]
    if within.empty:
        fastest = ok.sort_values("latency_ms").iloc[0]
        return fp32, (f"Keep FP32: no INT8 configuration ran within the latency budget ({budget_phrase} at "
                      f"{size}, {threads}); the fastest, {fastest['config']}, took {fastest['latency_ms']:.1f} ms.")
    visible = float(fp32.get("visible_frames", float("nan")))
    if rate_tolerance is None:
        rate_tolerance = 1.0 / visible if visible == visible and visible > 0 else 0.0
    best_rate = float(within["detection_rate"].max())
    accurate = within[within["detection_rate"] >= best_rate - rate_tolerance - 1e-12]
    best_error = float(accurate["median_error_px"].min())
    if best_error == best_error:  # a NaN error (no hit at all) leaves the detection rate to decide
        accurate = accurate[accurate["median_error_px"] <= best_error + error_tolerance_px + 1e-12]
    ranked = accurate.sort_values(["latency_ms", "median_error_px"], na_position="last")
    chosen = ranked.iloc[0]
    rate_drop = float(fp32["detection_rate"]) - float(chosen["detection_rate"])
    error_increase = float(chosen["median_error_px"]) - float(fp32["median_error_px"])
    numbers = (f"{chosen['detection_rate']:.1%} of visible frames found (FP32 {fp32['detection_rate']:.1%}), "
               f"median position error {chosen['median_error_px']:.2f} px (FP32 {fp32['median_error_px']:.2f} px)")
    if "median_angle_error_deg" in chosen and chosen["median_angle_error_deg"] == chosen["median_angle_error_deg"]:
        numbers += (f", median blur-angle error {chosen['median_angle_error_deg']:.1f} deg "
                    f"(FP32 {fp32['median_angle_error_deg']:.1f} deg)")
    if rate_drop > max_rate_drop or error_increase > max_error_increase_px:
        limit = (f"{rate_drop:.1%} of detections, more than the {max_rate_drop:.0%}" if rate_drop > max_rate_drop
                 else f"{error_increase:.2f} px of position error, more than the {max_error_increase_px:.2f} px")
        return fp32, (f"Keep FP32: the best INT8 configuration within the latency budget, {chosen['config']} "
                      f"({_config_phrase(chosen)}), loses {limit} this recommendation accepts, on {clips} "
                      f"({numbers}).")
    speedup = float(fp32["latency_ms"]) / float(chosen["latency_ms"])
    run_count = int(chosen["runs"]) if "runs" in chosen and chosen["runs"] == chosen["runs"] else 1
    timing = f"median across {run_count} recorded runs" if run_count > 1 else "median of the timed calls"
    spread = "the spread across runs" if run_count > 1 else "the spread of the timed calls"
    set_aside = str(chosen.get("runs_set_aside", "") or "")
    caveat = ""
    if set_aside:
        count = len(set_aside.split(", "))
        caveat += f" {count} recorded run{'s' if count != 1 else ''} taken under load {'are' if count != 1 else 'is'} set aside."
    if run_count < 3:
        caveat += (f" The speed rests on {run_count} quiet run{'s' if run_count != 1 else ''}, fewer than the three "
                   "the book decides on: re-record on a quiet machine before relying on it.")
    sentence = (f"Use {chosen['config']} ({_config_phrase(chosen)}): on {clips} at {size} it keeps "
                f"{numbers}, and runs in {chosen['latency_ms']:.1f} ms against {fp32['latency_ms']:.1f} ms for FP32 "
                f"({speedup:.2f}x, {threads}, {timing}). Of the {len(within)} INT8 configurations "
                f"(of {total}) that ran within the latency budget ({budget_phrase}), {len(accurate)} "
                f"{'is' if len(accurate) == 1 else 'are'} as accurate as the best (detection rate within one frame, "
                f"median position error within {error_tolerance_px:.2f} px)")
    if len(accurate) == 1:
        return chosen, sentence + ", and this is it." + caveat
    runner = ranked.iloc[1]
    sentence += "; this is the fastest of them"
    if {"latency_min_ms", "latency_max_ms"} <= set(ranked.columns) and \
            float(runner["latency_min_ms"]) <= float(chosen["latency_max_ms"]):
        sentence += (f", but its lead over {runner['config']} ({chosen['latency_ms']:.1f} vs "
                     f"{runner['latency_ms']:.1f} ms) is within {spread}, so on this machine "
                     f"they are equally good choices")
    return chosen, sentence + "." + caveat


def describe_tensor_errors(frame) -> str:
    """One sentence on a recorded worst-tensor ranking: layer groups of the worst activations, the worst one's
    SQNR, the worst weights' range."""
    frame = pd.DataFrame(frame)
    if frame.empty or "tensor_kind" not in frame:
        raise Int8MatrixError("no worst-tensor ranking recorded: run `python code/bench_int8.py` first")
    acts = frame[frame["tensor_kind"] == "activation"].sort_values("rank")
    weights = frame[frame["tensor_kind"] == "weight"]
    if acts.empty:
        raise Int8MatrixError("the ranking has no activation rows")
    names = {"se": "squeeze-and-excitation layers", "stem": "stem", "head": "head", "other": "rest of the network"}
    recorded = acts["group"] if "group" in acts else pd.Series([None] * len(acts), index=acts.index)
    derived = acts["module"].fillna("").map(lambda m: node_group(["", str(m)]) or "other")  # runs before "group"
    groups = recorded.where(recorded.notna() & (recorded.astype(str) != ""), derived).value_counts()
    parts = [f"{n} in the {names.get(g, g)}" for g, n in groups.items()]
    parts[0] = f"{groups.iloc[0]} {'is' if groups.iloc[0] == 1 else 'are'}" + parts[0][len(str(groups.iloc[0])):]
    worst = acts.iloc[0]
    sentence = (f"Of the {len(acts)} activations that quantize worst in the baseline model, "
                f"{', '.join(parts[:-1]) + ' and ' + parts[-1] if len(parts) > 1 else parts[0]}; the worst, "
                f"{worst['tensor']} ({worst['op']} in {worst['module']}), keeps a signal-to-quantization-noise "
                f"ratio of {worst['sqnr_db']:.1f} dB")
    if not weights.empty:
        sentence += (f", while the worst weights keep {weights['sqnr_db'].min():.1f} to {weights['sqnr_db'].max():.1f} dB")
    return sentence + "."


def latest_tensor_errors(results_dir: str | Path | None = None):
    return _latest(KIND_TENSOR_ERRORS, results_dir)


def _recorded(kind_name: str, results_dir):
    frame = results.load(kind_name, results_dir=results_dir)
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
    frame = pd.DataFrame(frame)
    if frame.empty:
        raise Int8MatrixError("no recorded INT8 matrix run: run `python code/bench_int8.py` first")
    if "run_id" not in frame:
        raise Int8MatrixError("the frame has no run_id column: pass rows from graphbook.record.results.load")
    framed = recorded_runs.add_machine(frame)
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
