"""What a fresh tensor costs on a CPU, and the allocator removed as a cause (Chapter 2): glibc maps a large
block anew and returns it on ``free``, so a fresh tensor's pages fault on first touch, which bytes-moved misses."""
from __future__ import annotations

import os
import platform
import sys

import pandas as pd
import torch

from graphbook.config import THREADS
from graphbook.measure import compiletime, timing
from graphbook.record import runs
from graphbook.teach.fusion_demo import chain, chain_into


def minor_page_faults(fn, calls: int = 3, trials: int = 5) -> float | None:
    """Minor page faults per call of ``fn`` after one untimed call; None without ``resource.getrusage``. The count
    covers the whole process, so other threads can only add faults: the smallest round is ``fn``'s."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    fn()
    counts = []
    for _ in range(trials):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            fn()
        counts.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls)
    return min(counts)


#: glibc's malloc serves a block above its mmap threshold with an mmap of its own and returns it to the kernel on
#: free; these switches make it serve every block from its heap and keep what is freed: no mmap, no trimming.
GLIBC_MMAP_THRESHOLD_DEFAULT = 128 * 1024              #: bytes: glibc's starting mmap threshold (mallopt(3))
GLIBC_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * 8          #: bytes: the largest it grows to on a 64-bit system
KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 40)}
_ALLOCATION_TAG = "GRAPHBOOK_ALLOCATION "


def _allocation_child(n_elements: int, repeats: int) -> dict:
    """In a fresh process: the eager chain, ``x * 2`` into a new tensor and into ``out=``, and page faults."""
    x, out = torch.randn(n_elements), torch.zeros(n_elements)
    with torch.no_grad():
        times = timing.interleaved({"eager chain": lambda: chain(x), "x * 2, new tensor": lambda: x * 2,
                                    "x * 2, out=": lambda: torch.mul(x, 2, out=out),
                                    "chain into out=": lambda: chain_into(x, out)}, warmup=2, repeats=repeats)
        faults = minor_page_faults(lambda: x * 2)
    return {**{name: result.median_ms for name, result in times.items()}, "faults_per_new_tensor": faults}


def allocator_ablation(n_elements: int = 2 ** 24, threads: int = THREADS, repeats: int = 7,
                       timeout: float = 300.0, swap: bool = False) -> list[dict] | str:
    """Eager code in two fresh processes: glibc's default allocator, one keeping freed memory (or why not)."""
    if platform.libc_ver()[0] != "glibc":
        return (f"the allocator experiment needs glibc's malloc (this system's C library is "
                f"{platform.libc_ver()[0] or 'not glibc'}), whose switches it uses")
    code = ("import json, torch; from graphbook.teach import allocation; torch.set_num_threads(%d); "
            "print(%r + json.dumps(allocation._allocation_child(%d, %d)))" % (threads, _ALLOCATION_TAG, n_elements,
                                                                             repeats))
    rows = []
    allocators = (("glibc default", {}), ("glibc keeping freed memory", KEEP_FREED_MEMORY))
    for label, extra in (allocators[::-1] if swap else allocators):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(extra, OMP_NUM_THREADS=str(threads))
        result, _ = compiletime.run_tagged_child(
            [sys.executable, "-c", code], _ALLOCATION_TAG, env=env, timeout=timeout,
            timeout_message=f"the allocation child ({label}) exceeded {timeout:.0f} s",
            failure_message=lambda proc: f"the allocation child ({label}) failed: {(proc.stderr or '')[-800:]}")
        rows.append({"allocator": label, **result})
    return rows


def allocator_runs(n_elements: int = 2 ** 25, threads: int = 1, runs: int = 3,
                   repeats: int = 7) -> pd.DataFrame | str:
    """:func:`allocator_ablation` in ``runs`` runs, the allocators' order swapped each run (or why it cannot run)."""
    pairs = []
    for number in range(1, runs + 1):
        pair = allocator_ablation(n_elements, threads=threads, repeats=repeats, swap=number % 2 == 0)
        if isinstance(pair, str):
            return pair
        pairs.append(pd.DataFrame(pair).assign(run=number, run_order=[1, 2]))
    frame = pd.concat(pairs, ignore_index=True).rename(columns={"allocator": "variant", "eager chain": "median_ms"})
    return frame[["variant", "run", "run_order", "median_ms", "faults_per_new_tensor"]].assign(
        part="allocator", size_elements=n_elements)


def recorded_split(frame):
    """Per machine, the newest recording's chain speed-up split into allocation and traffic (and allocator)."""
    chain_out, kept = ["eager", "preallocated out=", "torch.compile, out="], ["glibc default", "glibc keeping freed memory"]
    if "part" not in frame or not (frame["part"] == "chain").any():
        return pd.DataFrame()
    times = (runs.add_machine(frame[frame["part"].isin(["chain", "allocator"])])
             .pivot_table(index=[runs.MACHINE, "source_file", "run_id"], columns="variant", values="median_ms")
             .reindex(columns=chain_out + kept).dropna(subset=chain_out))
    factors = pd.DataFrame({"allocation": times["eager"] / times["preallocated out="],
                            "traffic": times["preallocated out="] / times["torch.compile, out="],
                            "both": times["eager"] / times["torch.compile, out="],
                            "allocator": times["glibc default"] / times["glibc keeping freed memory"]}).reset_index()
    dates = frame.groupby("source_file")["date"].max()
    newest = factors.assign(date=factors["source_file"].map(dates)).sort_values("date", kind="stable")
    newest = newest[newest["source_file"] == newest.groupby(runs.MACHINE)["source_file"].transform("last")]
    stats = {f"{name}{suffix}": (name, how) for name in ("allocation", "traffic", "both", "allocator")
             for suffix, how in (("", "median"), ("_min", "min"), ("_max", "max"))}
    table = newest.groupby([runs.MACHINE, "source_file"], sort=False).agg(runs=("run_id", "size"), **stats)
    return table.reset_index().dropna(axis=1, how="all")  # no allocator columns where none was recorded
