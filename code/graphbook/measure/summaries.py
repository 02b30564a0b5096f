"""The statistics a recorded row keeps of its readings, each defined once: what the harness and the load tests
write, and what a recording's verifier recomputes from the readings kept beside them. No torch here: the book's
server imports the load test's."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def summary(ms: Sequence[float]) -> dict:
    """The statistics a row records of its readings in milliseconds: the one definition a recording's verifier
    recomputes them by."""
    ms = np.asarray(ms, dtype=float)
    q1, median, q3 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(median), "min_ms": float(ms.min()), "max_ms": float(ms.max()), "q1_ms": float(q1),
            "q3_ms": float(q3), "repeats": len(ms)}


def percentiles(ms: Sequence[float]) -> dict:
    """A load test's latency statistics of its requests' readings in milliseconds (NaN with none): the one
    definition the load tests record and a recording's verifier recomputes."""
    if not len(ms):
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "max_ms"), float("nan"))
    p50, p90, p99 = np.percentile(np.asarray(ms, dtype=float), [50, 90, 99])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99), "max_ms": float(max(ms))}
