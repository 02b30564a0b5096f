"""Where BlurBall's time goes on a CPU: profiler ops grouped the article's way, and work against the peak.

Introduced in Chapter 5. The article profiles BlurBall on a GPU and groups the kernels into
convolution, batch norm, element-wise and other; :func:`profile_eager` does the same for one eager
forward on the CPU (the top-level ``aten::`` ops inside one forward), with :func:`op_category` as the
one rule that puts an op name in a category and :func:`group_profile` summing counts and time shares.
:func:`variant_rows` turns measured medians into the matrix's derived columns: speedup over eager FP32,
achieved GFLOP/s (2 x MACs / median time) and the share of the matmul peak of the same precision.

The GPU side (kernels, CUDA streams, first calls) is in :mod:`graphbook.gpu_profiling`.
"""
from __future__ import annotations

from typing import Iterable

from .results import SPEEDUP_VS_EAGER

CATEGORIES = ("convolution", "batch_norm", "elementwise", "other")
ELEMENTWISE_OPS = {"relu", "relu_", "add", "add_", "mul", "mul_", "sigmoid", "sigmoid_", "clamp",
                   "clamp_", "to", "_to_copy", "copy_", "hardtanh_"}
REFERENCE = "eager_fp32"
FORWARD_LABEL = "blurball_forward"


def op_category(name: str) -> str:
    """Article-style category of a profiler op name: convolution, batch_norm, elementwise, other (Chapter 5)."""
    short = name.split("::")[-1].lower()
    if "conv" in short:
        return "convolution"
    if "batch_norm" in short:
        return "batch_norm"
    if short in ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


def group_profile(top_level_ops: Iterable[tuple[str, float]]) -> list[dict]:
    """Counts, milliseconds and time shares per category from (name, microseconds) pairs (Chapter 5).

    One dict per category of :data:`CATEGORIES`, in that order: ``category``, ``ops``, ``ms``, ``share``.
    """
    totals = {c: {"count": 0, "us": 0.0} for c in CATEGORIES}
    for name, micros in top_level_ops:
        bucket = totals[op_category(name)]
        bucket["count"] += 1
        bucket["us"] += float(micros)
    all_us = sum(b["us"] for b in totals.values()) or 1.0
    return [{"category": c, "ops": totals[c]["count"], "ms": totals[c]["us"] / 1e3,
             "share": totals[c]["us"] / all_us} for c in CATEGORIES]


def profile_eager(model, x) -> list[dict]:
    """Profile one eager forward on the CPU; group its top-level aten ops by category (Chapter 5).

    One untimed forward first (oneDNN primitive creation is not part of a steady-state forward).
    Returns :func:`group_profile`'s list.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with torch.no_grad():
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function(FORWARD_LABEL):
                model(x)
    ops = []
    for event in prof.events():
        parent = event.cpu_parent
        if parent is not None and parent.name == FORWARD_LABEL and event.name.startswith("aten::"):
            ops.append((event.name, event.cpu_time_total))
    return group_profile(ops)


def variant_rows(measured: list[dict], macs: int, peaks: dict, reference: str = REFERENCE) -> list[dict]:
    """Each measured row plus speedup over ``reference``, achieved GFLOP/s and share of peak (Chapter 5).

    ``measured`` rows have ``variant``, ``precision`` and (unless skipped) ``median_ms``; ``peaks`` maps a
    precision to the matmul peak in GFLOP/s measured in the same run. A precision without a measured
    peak gets ``""`` for the peak and its share; a skipped row (no ``median_ms``) is passed through.
    """
    reference_row = next(r for r in measured if r["variant"] == reference)
    rows = []
    for r in measured:
        row = dict(r)
        if r.get("median_ms"):
            row[SPEEDUP_VS_EAGER] = reference_row["median_ms"] / r["median_ms"]
            row["gflop_per_s"] = 2 * macs / (r["median_ms"] * 1e-3) / 1e9
            peak = peaks.get(r.get("precision", "fp32"))
            row["peak_gflop_per_s"] = peak if peak else ""
            row["share_of_peak"] = row["gflop_per_s"] / peak if peak else ""
        rows.append(row)
    return rows
