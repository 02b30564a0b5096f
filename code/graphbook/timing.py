"""The timing harness: warm-up, then the median of N runs with its spread (Chapter 1).

Every time the book reports comes from :func:`time_cpu` or :func:`time_cuda` (or :func:`time_fn`,
which picks one by device), so all of them follow the same method:

1. ``warmup`` untimed calls first (caches, allocator, lazy initialisation, compilation),
2. ``repeats`` timed calls, each one timed on its own,
3. the median as the headline, with min/max and the quartiles (IQR) as the spread.

On a CPU each call is timed with :func:`time.perf_counter`. On a GPU, kernels run asynchronously, so
a host clock would time only the launch: :func:`time_cuda` records CUDA events around each call and
synchronizes before reading them.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence


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
    :func:`graphbook.book.setup_chapter`).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _check_counts(warmup, repeats)
    previous_threads = None
    if threads is not None:
        import torch

        from .environment import set_threads

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
            import torch

            torch.set_num_threads(previous_threads)
    return summarize(samples, name=name, warmup=warmup, device="cpu")


def cuda_available() -> bool:
    """True when torch sees a CUDA device (Chapter 1)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


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
    if not cuda_available():
        raise RuntimeError("time_cuda needs a CUDA device, but torch.cuda.is_available() is False; "
                           "use time_cpu (or time_fn(device='cpu')) on this machine")
    import torch

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


def alternating_timing(fn_a: Callable[[], object], fn_b: Callable[[], object], *, warmup: int = 2,
                       repeats: int = 10, names: tuple[str, str] = ("a", "b")):
    """Time two functions call by call, alternating A, B, A, B... (Chapter 3).

    On a shared machine the background load changes within seconds; alternating single calls makes
    both functions see the same load, so the *ratio* of their medians is trustworthy even when the
    absolute times are not. Returns two ``graphbook.timing.TimingResult`` (A, B).
    """
    if not (callable(fn_a) and callable(fn_b)):
        raise TypeError("fn_a and fn_b must be callables taking no arguments")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    for _ in range(warmup):
        fn_a()
        fn_b()
    a_ms, b_ms = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fn_a()
        middle = time.perf_counter()
        fn_b()
        end = time.perf_counter()
        a_ms.append(1000.0 * (middle - start))
        b_ms.append(1000.0 * (end - middle))
    return (summarize(a_ms, name=names[0], warmup=warmup),
            summarize(b_ms, name=names[1], warmup=warmup))


def relative_iqr(result: TimingResult) -> float:
    """Interquartile range over the median of one timed function (Chapter 5): a quiet CPU repeats
    a call within a few percent; a loaded one spreads the calls. ``inf`` for a zero median."""
    return result.iqr_ms / result.median_ms if result.median_ms > 0 else float("inf")


def repeated_alternating(fn_a: Callable[[], object], fn_b: Callable[[], object], *, runs: int = 3,
                         warmup: int = 2, repeats: int = 10, names: tuple[str, str] = ("a", "b"),
                         env: dict | None = None):
    """``runs`` independent alternated timings of two functions, as a long DataFrame (Chapter 5).

    Each run warms both functions up again and times them call by call (:func:`alternating_timing`);
    every second run lets B go first, so neither version always runs in the other's wake.
    One row per (run, version):
    ``run_id`` ("live-1", ...), ``variant``, ``median_ms``, ``min_ms``, ``max_ms``, ``q1_ms``,
    ``q3_ms``, ``repeats``, ``warmup``, ``went_first``, then the ``env`` fingerprint (default:
    :func:`graphbook.environment.fingerprint`), so :mod:`graphbook.runs` can summarize the runs,
    flag one taken under load and phrase the comparison exactly as for recorded runs.
    """
    import pandas as pd

    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs must be an integer >= 1, got {runs!r}")
    if names[0] == names[1]:
        raise ValueError(f"the two versions need different names, got {names!r}")
    if env is None:
        from .environment import fingerprint

        env = fingerprint()
    rows = []
    for index in range(runs):
        if index % 2 == 0:
            result_a, result_b = alternating_timing(fn_a, fn_b, warmup=warmup, repeats=repeats, names=names)
            first = names[0]
        else:
            result_b, result_a = alternating_timing(fn_b, fn_a, warmup=warmup, repeats=repeats,
                                                    names=(names[1], names[0]))
            first = names[1]
        for result in (result_a, result_b):
            record = result.as_dict()
            record["variant"] = record.pop("name")
            rows.append({"run_id": f"live-{index + 1}", **record, "went_first": first, **env})
    return pd.DataFrame(rows)


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
