"""Where BlurBall's time goes on a CPU, and work against the peak. The innermost op decides an op's category, on
CPU and GPU alike, so the casts autocast runs inside ``aten::conv2d`` count as "cast/copy", not convolution."""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Iterable

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from graphbook.config import THREADS
from graphbook.measure.probes import precision_ceiling
from graphbook.runtimes.onnx_utils import make_session, run_session

#: Profile categories, in table order (the CPU profile and the GPU kernel profile share them).
CATEGORIES = ("convolution", "batch_norm", "cast/copy", "elementwise", "other")
#: Element-wise ops, by their short name (``aten::relu_`` -> ``relu_``).
ELEMENTWISE_OPS = frozenset({"relu", "relu_", "add", "add_", "mul", "mul_", "sub", "sub_", "div", "div_",
                             "sigmoid", "sigmoid_", "clamp", "clamp_", "clamp_min", "clamp_min_",
                             "hardtanh", "hardtanh_", "threshold", "threshold_"})
_CONV_WORDS = ("conv", "fprop", "implicit_gemm", "winograd", "convolve")
_BN_WORDS = ("batch_norm", "batchnorm", "bn_fw", "bn_inf")
_COPY_WORDS = ("copy", "_to_copy", "cast")
_COPY_OPS = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous")
# CPU ops that only allocate or re-view memory: never counted as work in a CPU profile.
CPU_BOOKKEEPING_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::as_strided", "aten::view", "aten::reshape",
    "aten::_reshape_alias", "aten::resize_", "aten::t", "aten::transpose", "aten::expand", "aten::detach",
    "aten::detach_", "aten::alias", "aten::select", "aten::slice", "aten::unsqueeze", "aten::squeeze",
    "aten::permute", "aten::lift_fresh", "aten::set_", "aten::as_strided_", "aten::_nnpack_available"})
FORWARD_LABEL = "blurball_forward"


def op_category(op_name: str, kernel_name: str = "") -> str:
    """The category of an op, else of its kernel's name (Inductor's fused Triton kernels), else the name itself. Pass
    the innermost op: a top-level ``aten::conv2d`` would also take in its casts."""
    for name in ((op_name or "").lower(), (kernel_name or "").lower()):
        if not name:
            continue
        if name in _COPY_OPS:
            return "cast/copy"
        if any(word in name for word in _CONV_WORDS):
            return "convolution"
        if any(word in name for word in _BN_WORDS):
            return "batch_norm"
        if any(word in name for word in _COPY_WORDS):
            return "cast/copy"
        if name.split("::")[-1] in ELEMENTWISE_OPS:
            return "elementwise"
    return "other"


def is_annotation(event) -> bool:
    """True for a user or Inductor annotation (not work), whatever flag this profiler version sets."""
    if getattr(event, "is_user_annotation", False):
        return True
    activity = str(getattr(event, "activity_type", "") or "").lower()
    if "user_annotation" in activity:
        return True
    name = str(getattr(event, "name", ""))
    return name.startswith("## ") and name.endswith(" ##")


def device_kind(event) -> str:
    """``"CPU"`` or ``"CUDA"``: the device type of a profiler event."""
    kind = getattr(event, "device_type", "")
    return str(getattr(kind, "name", kind)).upper().replace("DEVICETYPE.", "")


def cpu_op_units(events: Iterable) -> list[dict]:
    """A CPU profile's work as units: nested ``aten::`` ops of one category are one unit, with its own time. A CPU op
    has no kernels to count; units make the CPU profile comparable with the GPU's kernels."""
    events = list(events)
    units: list[dict] = []

    def visit(event, unit):
        work = (device_kind(event) == "CPU" and not is_annotation(event) and str(event.name).startswith("aten::")
                and event.name not in CPU_BOOKKEEPING_OPS)
        if work and (unit is None or op_category(event.name) != unit["category"]):
            length = event.time_range.end - event.time_range.start
            if unit is not None:
                unit["us"] -= length
            unit = {"name": event.name, "category": op_category(event.name), "start_us": event.time_range.start,
                    "us": length}
            units.append(unit)
        for child in getattr(event, "cpu_children", []) or []:
            visit(child, unit)

    nested = {id(child) for event in events for child in getattr(event, "cpu_children", []) or []}
    for event in events:
        if id(event) not in nested and device_kind(event) == "CPU":
            visit(event, None)
    units.sort(key=lambda u: u["start_us"])
    return units


def _group_profile(ops: Iterable[tuple[str, float]]) -> list[dict]:
    """Ops, milliseconds and time share per category, in :data:`CATEGORIES` order."""
    totals = {c: {"count": 0, "us": 0.0} for c in CATEGORIES}
    for name, micros in ops:
        bucket = totals[op_category(name)]
        bucket["count"] += 1
        bucket["us"] += float(micros)
    all_us = sum(b["us"] for b in totals.values()) or 1.0
    return [{"category": c, "ops": totals[c]["count"], "ms": totals[c]["us"] / 1e3,
             "share": totals[c]["us"] / all_us} for c in CATEGORIES]


@contextlib.contextmanager
def without_profiler_banner():
    """Silence the profiler's native start/stop lines while the block runs. Kineto prints them from C++ on descriptor 2
    with no switch to turn them off, so fd 2 goes to ``/dev/null`` and is restored after, even on an error."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_eager(model, x, autocast_dtype=None) -> list[dict]:
    """One eager CPU forward's units by category, profiled after an untimed one (oneDNN's primitive creation)."""
    def forward():  # autocast entered per forward, as a caller does: its cast cache lives for one block
        with (torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None
              else contextlib.nullcontext()):
            return model(x)

    with torch.no_grad():
        forward()
        with without_profiler_banner(), profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function(FORWARD_LABEL):
                forward()
    return _group_profile((u["name"], u["us"]) for u in cpu_op_units(prof.events()))


def with_rates(frame: pd.DataFrame, macs: int, note: str) -> pd.DataFrame:
    """The frame with achieved GFLOP/s and its share of the same run's matmul rate, plus the rates as rows."""
    rates = [c for c in frame if c.startswith("matmul_")]
    frame = frame.assign(gflop_per_s=2 * macs / (frame["median_ms"] * 1e-3) / 1e9,
                         peak_gflop_per_s=frame.apply(lambda row: row.get(f"matmul_{row['precision']}"), axis=1))
    frame["share_of_matmul_rate"] = frame["gflop_per_s"] / frame["peak_gflop_per_s"]
    per_run = ["run", "run_count", "run_started", "copy_gbps", "went_first"]
    peaks = (frame.dropna(subset=["median_ms"]).drop_duplicates("run")[per_run + rates]
             .melt(id_vars=per_run, var_name="variant", value_name="peak_gflop_per_s"))
    peaks = peaks.assign(record="peak", precision=peaks["variant"].str.removeprefix("matmul_"), note=note)
    return pd.concat([frame.drop(columns=rates), peaks]).sort_values("run", kind="stable", ignore_index=True)


def _read_profile(profile_path: str | Path, runs: int = 1):
    """Per-operator time from an ONNX Runtime profile's ``*_kernel_time`` events, per run, sorted by time."""
    events = json.loads(Path(profile_path).read_text())
    rows = [(e["args"].get("op_name", "?"), float(e.get("dur", 0)))
            for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    if not rows:  # a file from elsewhere: say what is missing
        raise ValueError(f"{profile_path} has no kernel events; was the session run after profiling was enabled?")
    frame = pd.DataFrame(rows, columns=["op_name", "dur_us"])
    table = frame.groupby("op_name").agg(nodes=("dur_us", "size"), total_us=("dur_us", "sum")).reset_index()
    table["nodes"] = (table["nodes"] / runs).round().astype(int)
    table["total_ms"] = table["total_us"] / runs / 1e3
    table["share"] = table["total_us"] / table["total_us"].sum()
    return table.drop(columns="total_us").sort_values("total_ms", ascending=False).reset_index(drop=True)


def profile_operators(path: str | Path, inputs, *, level="all", threads: int = THREADS, runs: int = 3,
                      workdir: str | Path):
    """Per-op table of ``runs`` profiled runs (the warm-up runs in a session of its own, outside the profile)."""
    warm = make_session(path, level=level, threads=threads)
    run_session(warm, inputs)
    del warm
    session = make_session(path, level=level, threads=threads, profile_prefix=Path(workdir) / "ort_profile")
    for _ in range(runs):
        run_session(session, inputs)
    profile_file = session.end_profiling()
    return _read_profile(profile_file, runs=runs)


def share_of_ceiling(median_ms: float, executed_macs: float, precision: str, env: dict) -> dict:
    """One timing's rate from the MACs the graph really runs, and its share of the ceiling (None without one)."""
    rate = 2 * executed_macs / (median_ms * 1e-3) / 1e9
    ceiling = precision_ceiling(env, precision)["gflop_per_s"]
    return {"gflop_per_s": rate, "ceiling_gflop_per_s": ceiling, "share": rate / ceiling if ceiling else None}
