"""The timing harness, torch.utils.benchmark's Timer, under the book's run protocol (the median block is the
headline). A one-off duration (a compile, a build) is a difference of two ``time.perf_counter()`` readings."""
from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils import benchmark

from graphbook.measure import probes
from graphbook.measure.environment import fingerprint


@dataclass(frozen=True)
class TimingResult:
    """Milliseconds per call of one timed function; ``repeats`` is the number of blocks timed."""

    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    repeats: int
    warmup: int

    def as_dict(self) -> dict:
        return asdict(self)


def _result(seconds: Sequence[float], warmup: int) -> TimingResult:
    ms = np.asarray(seconds) * 1e3
    q1, median, q3 = np.percentile(ms, [25, 50, 75])
    return TimingResult(float(median), float(ms.min()), float(ms.max()), float(q1), float(q3), len(ms), warmup)


def time_cpu(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10,
             threads: int | None = None) -> TimingResult:
    """``fn()`` timed by the Timer at ``threads`` (restored after): ``warmup`` calls, then blocks for about
    ``repeats`` calls."""
    return _result(probes.blocked_times(fn, repeats, warmup=warmup, threads=threads), warmup)


def interleaved(calls: Mapping[str, Callable[[], object]], *, warmup: int = 2,
                repeats: int = 10) -> dict[str, TimingResult]:
    """Several functions timed in turn, A, B, C, A, B, C..., ``repeats`` rounds. Taking turns makes every function see
    the same background load, so their ratios hold while absolute times drift."""
    timers = {name: benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
              for name, fn in calls.items()}
    for timer in timers.values():
        timer.timeit(max(warmup, 1))
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, timer in timers.items():
            seconds[name] += timer.blocked_autorange(min_run_time=0).times
    return {name: _result(values, warmup) for name, values in seconds.items()}


def repeated_runs(calls: Mapping[str, Callable[[], object]], *, runs: int = 3, warmup: int = 3,
                  repeats: int = 10, interleave: bool = False, probe_bytes: int | None = 64 * 2**20,
                  probes: Callable[[], dict] | None = None, threads: Mapping[str, int] | None = None,
                  measure: Callable[[str, int], dict] | None = None,
                  groups: Sequence[Sequence[str]] | None = None,
                  log: Callable[[str], object] | None = None) -> list[dict]:
    """The book's run protocol: ``runs`` independent runs of named callables, one row per run and name. Each run starts
    with a ``copy_`` bandwidth probe (so a run under load can be told apart) and times the names in an order that
    rotates between runs (:func:`rotated`); ``measure`` replaces the timing of a name."""
    groups = [list(g) for g in groups] if groups is not None else [list(calls)]
    rows = []
    for index in range(runs):
        order = [name for group in groups for name in rotated(group, index)]
        per_run = {"run": index + 1, "run_count": runs,
                   "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   "went_first": order[0]}
        if probe_bytes is not None:
            per_run["copy_gbps"] = _copy_gbps(probe_bytes)
        per_run.update(probes() if probes else {})
        if log is not None:
            copy = f"copy_ {per_run['copy_gbps']:.1f} GB/s, " if "copy_gbps" in per_run else ""
            log(f"run {index + 1}/{runs}: {copy}order {', '.join(map(str, order))}")
        if measure is not None:
            measured = {name: measure(name, index) for name in order}
        elif interleave:
            measured = {name: result.as_dict() for name, result in
                        interleaved({n: calls[n] for n in order}, warmup=warmup, repeats=repeats).items()}
        else:
            measured = {name: time_cpu(calls[name], warmup=warmup, repeats=repeats,
                                       threads=(threads or {}).get(name)).as_dict() for name in order}
        for position, name in enumerate(order, start=1):
            rows.append({**per_run, "run_order": position, "variant": name, **measured[name]})
            if log is not None and "median_ms" in measured[name]:
                log(f"  {name}: median {measured[name]['median_ms']:.1f} ms")
    return rows


def _copy_gbps(nbytes: int) -> float:  # the module-level name: repeated_runs has a parameter named probes
    return probes.copy_bandwidth(nbytes=nbytes, repeats=5)["gb_per_s"]


def live_runs(calls: Mapping[str, Callable[[], object]], *, env: dict | None = None, **protocol):
    """:func:`repeated_runs` measured live in a chapter, a DataFrame with the ``env`` fingerprint on every row. So
    :mod:`graphbook.record.runs` treats live runs exactly as recorded ones."""
    frame = pd.DataFrame(repeated_runs(calls, **{"interleave": True, "probe_bytes": None, **protocol}))
    frame.insert(0, "run_id", "live-" + frame["run"].astype(str))
    return frame.assign(**(fingerprint() if env is None else env))


def rotated(names: Sequence, run_index: int) -> list:
    """``names`` in the order of run ``run_index`` of a round-robin rotation, so every name goes first once and
    none always runs in another's wake."""
    names = list(names)
    shift = run_index % len(names) if names else 0
    return names[shift:] + names[:shift]
