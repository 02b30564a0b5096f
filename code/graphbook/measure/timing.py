"""The timing harness under the book's run protocol (the median is the headline): torch.utils.benchmark's Timer for
one function, a ``time.perf_counter()`` reading per call for functions taken in turn, and the same difference of two
readings for a one-off duration (a compile, a build)."""
from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import pandas as pd

from graphbook.measure import probes
from graphbook.measure.environment import fingerprint
from graphbook.measure.summaries import summary


@dataclass(frozen=True)
class TimingResult:
    """Milliseconds per call of one timed function; ``repeats`` is the number of blocks timed, ``times_ms`` each
    block's reading, kept so that every statistic above can be recomputed from the record."""

    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    repeats: int
    warmup: int
    times_ms: tuple[float, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


def _result(seconds: Sequence[float], warmup: int) -> TimingResult:
    ms = [float(s) * 1e3 for s in seconds]
    return TimingResult(**summary(ms), warmup=warmup, times_ms=tuple(ms))


def time_cpu(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10,
             threads: int | None = None) -> TimingResult:
    """``fn()`` timed by the Timer at ``threads``: ``warmup`` calls, then blocks for about ``repeats`` calls."""
    return _result(probes.blocked_times(fn, repeats, warmup=warmup, threads=threads), warmup)


def interleaved(calls: Mapping[str, Callable[[], object]], *, warmup: int = 2,
                repeats: int = 10) -> dict[str, TimingResult]:
    """Several CPU functions timed in turn (A, B, C, A, B, C...), one call each per turn, so their ratios hold while
    the background load drifts. Each call is read off ``time.perf_counter``: the Timer cannot time one call without
    untimed calls of its own first, which would put a call of the same function before every timed one."""
    for _ in range(max(warmup, 1)):
        for fn in calls.values():
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return {name: _result(values, warmup) for name, values in seconds.items()}


#: A timing mode: given the names in this run's order and the run's index, each name's timing columns.
Timer = Callable[[Sequence[str], int], dict]


def one_by_one(calls: Mapping[str, Callable[[], object]], *, warmup: int = 3, repeats: int = 10,
               threads: Mapping[str, int] | None = None) -> Timer:
    """Each name timed in its turn by :func:`time_cpu`, at its own thread count where ``threads`` gives one."""
    return lambda order, _: {name: time_cpu(calls[name], warmup=warmup, repeats=repeats,
                                            threads=(threads or {}).get(name)).as_dict() for name in order}


def in_turns(calls: Mapping[str, Callable[[], object]], *, warmup: int = 2, repeats: int = 10) -> Timer:
    """The names timed call by call in turn (:func:`interleaved`), so they share one run's load."""
    return lambda order, _: {name: result.as_dict() for name, result in
                             interleaved({n: calls[n] for n in order}, warmup=warmup, repeats=repeats).items()}


def copy_probe(nbytes: int = 64 * 2**20) -> Callable[[], dict]:
    """A run's ``copy_`` bandwidth, measured before it times anything, so a run under load can be told apart."""
    return lambda: {"copy_gbps": probes.copy_bandwidth(nbytes=nbytes, repeats=5)["gb_per_s"]}


def repeated_runs(names: Sequence[str], timer: Timer, *, runs: int = 3, probe: Callable[[], dict] | None = None,
                  groups: Sequence[Sequence[str]] | None = None, log: Callable[[str], object] | None = None) -> list[dict]:
    """The book's run protocol: ``runs`` runs, each with ``probe``'s columns, timing the names with ``timer`` in an
    order that rotates between runs (each group of ``groups`` on its own); one row per run and name."""
    groups = [list(g) for g in groups] if groups is not None else [list(names)]
    rows = []
    for index in range(runs):
        order = [name for group in groups for name in rotated(group, index)]
        per_run = {"run": index + 1, "run_count": runs, "went_first": order[0],
                   "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   **(probe() if probe else {})}
        if log is not None:
            copy = f"copy_ {per_run['copy_gbps']:.1f} GB/s, " if "copy_gbps" in per_run else ""
            log(f"run {index + 1}/{runs}: {copy}order {', '.join(map(str, order))}")
        measured = timer(order, index)
        for position, name in enumerate(order, start=1):
            rows.append({**per_run, "run_order": position, "variant": name, **measured[name]})
            if log is not None and "median_ms" in measured[name]:
                log(f"  {name}: median {measured[name]['median_ms']:.1f} ms")
    return rows


def live_runs(calls: Mapping[str, Callable[[], object]], *, runs: int = 3, warmup: int = 2, repeats: int = 10,
              probe_bytes: int | None = None, env: dict | None = None):
    """Names timed in turn in ``runs`` rotated runs, live in a chapter, every row with the ``env`` fingerprint."""
    probe = copy_probe(probe_bytes) if probe_bytes else None
    frame = pd.DataFrame(repeated_runs(list(calls), in_turns(calls, warmup=warmup, repeats=repeats), runs=runs,
                                       probe=probe))
    frame.insert(0, "run_id", "live-" + frame["run"].astype(str))
    return frame.assign(**(fingerprint() if env is None else env))


def rotated(names: Sequence, run_index: int) -> list:
    """``names`` in run ``run_index``'s order of a round-robin rotation, so none always runs in another's wake."""
    names = list(names)
    shift = run_index % len(names) if names else 0
    return names[shift:] + names[:shift]
