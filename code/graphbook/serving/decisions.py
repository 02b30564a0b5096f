"""The deployment decisions of Chapter 7, each from one machine's recorded runs: records, the page writes the
sentences (Chapter 7)."""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from graphbook.method import decision, variants
from graphbook.record import results, runs

#: Lower precisions are judged by a different check (peaks and decoded balls, not the FP32 tolerance).
_NOT_FP32 = "bf16|int8|fp16|matmul"
#: The lower precisions a CPU worker could serve, judged on the decoded ball (Chapter 5), never on logits.
LOWER_PRECISIONS = ("bf16", "int8")


def _fp32_runs_of_one_machine(cpu_frame, *, here: Mapping | str | None = None):
    """The FP32 variant rows of the CPU matrix, flagged for load, of the one machine that decides (Chapter 7)."""
    if cpu_frame is None or not len(cpu_frame):
        return cpu_frame, None
    fp32_rows = cpu_frame[(cpu_frame["record"] == "variant") & ~cpu_frame["variant"].str.contains(_NOT_FP32)
                          & cpu_frame["variant"].isin(list(variants.REGISTRY))]
    flagged = runs.flag_under_load(fp32_rows)
    machine = runs.deciding_machine(flagged, here=here)
    if machine is None:
        return flagged.iloc[0:0], None
    return runs.single_machine(flagged, machine), machine


def restart_costs(restart_frame) -> pd.DataFrame:
    """Per restart path of the newest recording whose outputs were all correct: the median seconds from launch to the
    first correct output, and the machine (Chapter 7)."""
    if restart_frame is None or not len(restart_frame):
        return pd.DataFrame(columns=["path", "first_output_s", runs.MACHINE])
    newest = runs.single_machine(results.latest_run(restart_frame))
    correct = newest.groupby("path").filter(lambda rows: rows["same_output"].astype(bool).all())
    return (correct.groupby("path")["first_output_s"].median().reset_index()
            .assign(**{runs.MACHINE: str(newest[runs.MACHINE].iloc[0])}).sort_values("first_output_s"))


def cpu_worker(cpu_frame, *, here: Mapping | str | None = None) -> decision.Decision | None:
    """Which FP32 variant to serve on a CPU: the decision over one machine's quiet runs, or None without any."""
    rows, machine = _fp32_runs_of_one_machine(cpu_frame, here=here)
    if machine is None:
        return None
    return decision.decide(rows, machine)


def lower_precision_worker(cpu_frame, *, here: Mapping | str | None = None) -> dict | None:
    """Whether a bf16 or INT8 variant beats FP32 on a CPU: the lower-precision decision (the task check and a correct
    FP32 twin, Chapter 5's rule), the FP32 one on the same machine, and the winner's share of its ceiling."""
    if cpu_frame is None or not len(cpu_frame) or results.SAME_BALL not in cpu_frame.columns:
        return None
    variant_rows = cpu_frame[(cpu_frame["record"] == "variant") & cpu_frame["variant"].isin(list(variants.REGISTRY))]
    checked = variant_rows[variant_rows["precision"].isin(LOWER_PRECISIONS) & variant_rows[results.SAME_BALL].notna()]
    # every variant of the runs that carry the task check: the FP32 twins and the eager reference are among them
    flagged = runs.flag_under_load(variant_rows[variant_rows["run_id"].isin(set(checked["run_id"]))])
    machine = runs.deciding_machine(flagged, here=here) if len(checked) else None
    if machine is None:
        return None
    mine = runs.single_machine(flagged, machine)
    lower = decision.decide(mine, machine, candidates=sorted(set(checked["variant"])))
    fp32 = decision.decide(mine, machine, candidates=[v for v in set(mine["variant"])
                                                      if variants.get(v).precision == "fp32"])
    rated = decision.executed_rates(mine[~mine[runs.UNDER_LOAD] & (mine["variant"] == lower.best)])
    return {"lower": lower, "fp32": fp32,
            "faster_than_fp32": lower.best is not None and fp32.best is not None
            and lower.best_median_ms < fp32.best_median_ms,
            "share_of_ceiling": float(rated["share_of_ceiling"].astype(float).median()),
            "share_of_fp32_ceiling": float(rated["share_of_fp32_ceiling"].astype(float).median())}


def portable_export(cpu_frame, *, here: Mapping | str | None = None) -> dict | None:
    """The portable ONNX export's CPU check on the deciding machine: whether every run matched eager, its median."""
    rows, machine = _fp32_runs_of_one_machine(cpu_frame, here=here)
    onnx = rows[rows["variant"] == "ort_exporter_optimized_all"] if machine else rows
    if machine is None or not len(onnx):
        return None
    return {runs.MACHINE: machine, "matched_eager": bool(onnx["same_output"].fillna(False).astype(bool).all()),
            "median_ms": float(runs.summarize_runs(onnx)["median"].iloc[0])}
