"""The timing harness: warm-up, then the median of N calls with its spread, in repeated runs (Chapter 1).

Every per-call time the book reports comes from :func:`time_cpu` or :func:`time_cuda` (or :func:`time_fn`,
which picks one by device), inside the run protocol :func:`repeated_runs` wherever versions are compared,
so all of them follow the same method:

1. ``warmup`` untimed calls first (caches, allocator, lazy initialisation, compilation),
2. ``repeats`` timed calls, each one timed on its own,
3. the median as the headline, with min/max and the quartiles (IQR) as the spread.

On a CPU each call is timed with :func:`time.perf_counter`. On a GPU, kernels run asynchronously, so
a host clock would time only the launch: :func:`time_cuda` records CUDA events around each call and
synchronizes before reading them. One-off durations (a compile, a build) use :class:`Stopwatch`.
"""
from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import pandas as pd
import torch

from graphbook.measure.environment import fingerprint, set_threads
from graphbook.measure.probes import copy_bandwidth


@dataclass(frozen=True)
class TimingResult:
    """Summary of one timed function (Chapter 1). All times are milliseconds per call."""

    name: str
    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    repeats: int
    warmup: int
    device: str

    @property
    def iqr_ms(self) -> float:
        """Interquartile range (q3 - q1): the spread that ignores the odd outlier."""
        return self.q3_ms - self.q1_ms

    def as_dict(self) -> dict:
        """Plain dict of the fields (for CSV rows and DataFrames)."""
        return asdict(self)


def _check_counts(warmup: int, repeats: int) -> None:
    for label, value, lowest in (("warmup", warmup, 0), ("repeats", repeats, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
            raise ValueError(f"{label} must be an integer >= {lowest}, got {value!r}")


def summarize(samples_ms: Sequence[float], *, name: str = "", warmup: int = 0,
              device: str = "cpu") -> TimingResult:
    """Median, min/max and quartiles of per-call times in ms (Chapter 1).

    Quartiles use the "inclusive" method (linear interpolation between samples), so they always lie
    between min and max, even for two samples.
    """
    samples = [float(s) for s in samples_ms]
    if not samples:
        raise ValueError("summarize needs at least one sample")
    if len(samples) == 1:
        q1 = q3 = samples[0]
    else:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return TimingResult(name=name, median_ms=statistics.median(samples), min_ms=min(samples),
                        max_ms=max(samples), q1_ms=q1, q3_ms=q3, repeats=len(samples),
                        warmup=warmup, device=device)


def time_cpu(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10, name: str = "",
             threads: int | None = None) -> TimingResult:
    """Time ``fn()`` on the CPU: ``warmup`` untimed calls, then ``repeats`` timed ones (Chapter 1).

    ``threads``, if given, pins torch's intra-op thread count for the measurement and restores the
    previous count afterwards; otherwise whatever count is in force is used (chapters set it in
    :func:`graphbook.teach.book.setup_chapter`).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _check_counts(warmup, repeats)
    previous_threads = None
    if threads is not None:
        previous_threads = torch.get_num_threads()
        set_threads(threads)
    try:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    finally:
        if previous_threads is not None:
            torch.set_num_threads(previous_threads)
    return summarize(samples, name=name, warmup=warmup, device="cpu")


def _cuda_available() -> bool:
    """True when torch sees a CUDA device (Chapter 1)."""
    return torch.cuda.is_available()


def time_cuda(fn: Callable[[], object], *, warmup: int = 10, repeats: int = 50,
              name: str = "") -> TimingResult:
    """Time ``fn()`` on the current CUDA device with CUDA events (Chapter 1).

    Each timed call sits between two events on the current stream; the device is synchronized
    before the warm-up, after it, and before the events are read, so the times are GPU time per
    call rather than the (much shorter) launch time the host sees. Raises RuntimeError without CUDA.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _check_counts(warmup, repeats)
    if not _cuda_available():
        raise RuntimeError("time_cuda needs a CUDA device, but torch.cuda.is_available() is False; "
                           "use time_cpu (or time_fn(device='cpu')) on this machine")

    torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) for start, end in pairs]
    return summarize(samples, name=name, warmup=warmup, device="cuda")


def time_fn(fn: Callable[[], object], device: str = "cpu", **kwargs) -> TimingResult:
    """Dispatch to :func:`time_cpu` or :func:`time_cuda` by ``device`` ("cpu" or "cuda") (Chapter 1)."""
    kind = str(device).split(":", 1)[0]
    if kind == "cpu":
        return time_cpu(fn, **kwargs)
    if kind == "cuda":
        return time_cuda(fn, **kwargs)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def interleaved(calls: Mapping[str, Callable[[], object]], *, warmup: int = 2,
                repeats: int = 10) -> dict[str, TimingResult]:
    """Time several functions call by call, in turn: A, B, C, A, B, C... (Chapter 3).

    On a shared machine the background load changes within seconds; interleaving single calls makes
    every function see the same load, so the *ratios* of their medians hold even when the absolute times
    drift. ``warmup`` untimed rounds first. Returns ``{name: TimingResult}`` in the order given.
    """
    if not calls or not all(callable(fn) for fn in calls.values()):
        raise TypeError("calls must map names to callables taking no arguments")
    _check_counts(warmup, repeats)
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append(1000.0 * (time.perf_counter() - start))
    return {name: summarize(values, name=name, warmup=warmup) for name, values in samples.items()}


def repeated_runs(calls: Mapping[str, Callable[[], object]], *, runs: int = 3, warmup: int = 3,
                  repeats: int = 10, interleave: bool = False, probe_bytes: int | None = 64 * 2**20,
                  probes: Callable[[], dict] | None = None, threads: Mapping[str, int] | None = None,
                  measure: Callable[[str, int], dict] | None = None,
                  groups: Sequence[Sequence[str]] | None = None,
                  log: Callable[[str], object] | None = None) -> list[dict]:
    """The book's run protocol: ``runs`` independent runs of named callables, one row per run and name (Chapter 2).

    Every benchmark, the fusion demo and every chapter that compares versions times them this way:

    1. each run starts with its own physical reference, the ``copy_`` bandwidth on ``probe_bytes`` per
       buffer (``copy_gbps``; :func:`graphbook.record.runs.flag_under_load` reads it), plus whatever
       ``probes()`` returns (for example a matmul rate), so a run taken under load can be told apart;
    2. the names are timed in an order that rotates between runs (:func:`rotated`), so none always runs in
       another's wake; with ``interleave`` call by call (:func:`interleaved`), otherwise one block each
       (:func:`time_cpu`, with ``threads[name]`` pinned when given);
    3. ``measure(name, run_index)``, when given, replaces step 2's timing of one name (the ablation times
       each configuration against eager in alternated pairs) and returns that row's columns.

    ``groups`` splits the names into comparisons that rotate each on its own within a run (the fusion demo's
    BN pair and its chain versions), so every group's members take turns going first.

    Rows carry ``run`` (1, 2 ...), ``run_count``, ``run_started`` (UTC), ``run_order`` (1 = went first),
    ``went_first``, ``copy_gbps`` (unless ``probe_bytes`` is None), the probes' columns, ``variant``
    and the timing fields (``median_ms``, ``min_ms``, ``max_ms``, ``q1_ms``, ``q3_ms``, ``repeats``, ``warmup``).
    Nothing is built or compiled here: callers build and check every version once, before the runs.
    """
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs must be an integer >= 1, got {runs!r}")
    if not calls:
        raise ValueError("repeated_runs needs at least one named callable")
    _check_counts(warmup, repeats)
    names = list(calls)
    groups = [list(g) for g in groups] if groups is not None else [names]
    if sorted(n for g in groups for n in g) != sorted(names):
        raise ValueError("groups must hold every name of calls exactly once")
    rows: list[dict] = []
    for index in range(runs):
        order = [name for group in groups for name in rotated(group, index)]
        per_run = {"run": index + 1, "run_count": runs,
                   "run_started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   "went_first": order[0]}
        if probe_bytes is not None:
            per_run["copy_gbps"] = copy_bandwidth(nbytes=probe_bytes, repeats=5)["gb_per_s"]
        if probes is not None:
            per_run.update(probes())
        if log is not None:
            copy = f"copy_ {per_run['copy_gbps']:.1f} GB/s, " if "copy_gbps" in per_run else ""
            log(f"run {index + 1}/{runs}: {copy}order {', '.join(map(str, order))}")
        if measure is not None:
            measured = {name: measure(name, index) for name in order}
        elif interleave:
            measured = {name: _timing_columns(result)
                        for name, result in interleaved({n: calls[n] for n in order}, warmup=warmup,
                                                        repeats=repeats).items()}
        else:
            measured = {name: _timing_columns(time_cpu(calls[name], warmup=warmup, repeats=repeats, name=str(name),
                                                       threads=(threads or {}).get(name)))
                        for name in order}
        for position, name in enumerate(order, start=1):
            rows.append({**per_run, "run_order": position, "variant": name, **measured[name]})
            if log is not None and "median_ms" in measured[name]:
                log(f"  {name}: median {measured[name]['median_ms']:.1f} ms")
    return rows


def _timing_columns(result: TimingResult) -> dict:
    columns = result.as_dict()
    columns.pop("name")
    return columns


def live_runs(calls: Mapping[str, Callable[[], object]], *, env: dict | None = None, **protocol):
    """:func:`repeated_runs` measured live in a chapter, as a DataFrame with the machine on every row (Chapter 2).

    Interleaved call by call and without a ``copy_`` probe unless ``protocol`` says otherwise. Rows get
    ``run_id`` ``live-<run>`` and the ``env`` fingerprint (default
    :func:`graphbook.measure.environment.fingerprint`), so :mod:`graphbook.record.runs` summarizes the runs,
    flags one taken under load and phrases the comparison exactly as for recorded runs.
    """
    if env is None:
        env = fingerprint()
    protocol = {"interleave": True, "probe_bytes": None, **protocol}
    rows = repeated_runs(calls, **protocol)
    return pd.DataFrame([{"run_id": f"live-{row['run']}", **row, **env} for row in rows])


class Stopwatch:
    """Seconds since it was started, for one-off durations: a compile, a build, a timeline (Chapter 6).

    Per-call times come from :func:`time_cpu` and :func:`repeated_runs`; a single event that cannot be
    repeated (the first call that compiles, a server's start) is measured with this instead.
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def seconds(self) -> float:
        """Seconds elapsed since the stopwatch started."""
        return time.perf_counter() - self._start


def rotated(names: Sequence, run_index: int) -> list:
    """``names`` in the order of run ``run_index`` (0-based) of a round-robin rotation (Chapter 5).

    Run 0 keeps the order, run 1 starts with the second name, and so on, wrapping around, so over
    ``len(names)`` runs every variant goes first once and none always runs in another's wake (a CPU
    that heats up, a cache another variant filled, a neighbour's load that comes and goes).
    """
    names = list(names)
    if not names:
        return names
    shift = run_index % len(names)
    return names[shift:] + names[:shift]
