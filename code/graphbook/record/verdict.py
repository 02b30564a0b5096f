"""The book's one decision rule: a comparison of two timed variants is *faster*, *within 5 %* or *can't tell at this
noise*, never more than its data can tell. The statistic is the paired log ratio of their times (one per run or per
block, both timed under the same load), its noise pooled where the data allow; the outcome comes from its 95 %
interval, as criterion.rs's noise threshold, pyperf's "not significant" and two one-sided tests of equivalence do.
A check that passed on ``n`` samples has a resolution too: it bounds the failure rate only at ``1 - 0.05**(1/n)``."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import mpmath

#: A lead whose interval does not clear this band is no lead (criterion.rs's default noise threshold, 1 %).
PRACTICAL_BAND = 0.01
#: Two variants whose whole interval lies within this of each other are the same speed.
EQUIVALENCE_BAND = 0.05
CONFIDENCE = 0.95
#: The power a detectable lead promises, and the power it is computed at: a lead computed at exactly 80 % is detected
#: 80 % of the time only on average, so the promise holds with a margin.
POWER, POWER_COMPUTED_AT = 0.80, 0.85
FASTER, WITHIN, CANT_TELL = "faster", "within 5 %", "can't tell at this noise"
#: The largest failure rate a lower-precision verdict's check may leave unbounded: a pass must bound it at 10 %.
MAX_FAILURE_BOUND = 0.10


@dataclass(frozen=True)
class Comparison:
    """How much faster the first of two variants is: ``lead`` = the second's time over the first's (geometric mean of
    the paired ratios), its 95 % interval, the outcome, and the lead these pairs would detect at least 80 % of the
    time at this noise (the minimum detectable lead)."""

    lead: float
    lead_low: float
    lead_high: float
    outcome: str
    detectable_lead: float
    pairs: int
    noise: float          # standard deviation of one paired log ratio
    noise_df: int         # its degrees of freedom


@functools.cache
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (``df`` degrees of freedom), from the regularized incomplete beta function."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    tail = min(p, 1 - p)

    def upper_tail_minus(x):
        return mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True) / 2 - tail
    x = abs(float(mpmath.findroot(upper_tail_minus, statistics.NormalDist().inv_cdf(1 - tail))))
    return x if p > 0.5 else -x


def compare(log_ratios: Sequence[float], *, noise: float | None = None, noise_df: int | None = None) -> Comparison:
    """The rule on paired ``log(t_second / t_first)`` values. ``noise`` (with ``noise_df``): one paired log ratio's
    standard deviation pooled over more pairs than these (the screen's residual, or the finals' pairs); without it,
    these pairs' own spread (two pairs at least)."""
    values = [float(v) for v in log_ratios]
    n = len(values)
    if noise is None:
        if n < 2:
            raise ValueError("one pair has no spread of its own: pass the pooled noise")
        noise, noise_df = statistics.stdev(values), n - 1
    if noise_df is None or noise_df < 1:
        raise ValueError(f"the noise needs its degrees of freedom (at least 1), got {noise_df!r}")
    mean, error = statistics.fmean(values), noise / math.sqrt(n)
    t = t_quantile(1 - (1 - CONFIDENCE) / 2, noise_df)
    low, high = math.exp(mean - t * error), math.exp(mean + t * error)
    detectable = math.exp(math.log1p(PRACTICAL_BAND) + (t + t_quantile(POWER_COMPUTED_AT, noise_df)) * error)
    if low > 1 + PRACTICAL_BAND:
        outcome = FASTER
    elif 1 - EQUIVALENCE_BAND < low and high < 1 + EQUIVALENCE_BAND:
        outcome = WITHIN
    else:
        outcome = CANT_TELL
    return Comparison(math.exp(mean), low, high, outcome, detectable, n, noise, int(noise_df))


def pooled_noise(log_times) -> tuple[float, int] | None:
    """One paired log ratio's standard deviation from a screen of variants (columns) timed in runs (rows), none
    missing: the residual of the two-way model log t = variant + run + e, so each variant's level and each run's load
    are taken out, and a paired difference has twice its variance. None with fewer than two runs or variants."""
    rows, columns = log_times.shape
    if rows < 2 or columns < 2:
        return None
    residual = (log_times - log_times.mean(axis=0) - log_times.mean(axis=1).to_numpy()[:, None]
                + float(log_times.to_numpy().mean()))
    df = (rows - 1) * (columns - 1)
    return math.sqrt(2 * float((residual.to_numpy() ** 2).sum()) / df), df


def failure_bound(samples: int, confidence: float = CONFIDENCE) -> float:
    """The failure rate a check that passed on every one of ``samples`` bounds at ``confidence``: ``1 -
    (1 - confidence)**(1/samples)``, about 3/n (the rule of three); 1.0 with no sample."""
    return 1.0 if samples < 1 else 1 - (1 - confidence) ** (1 / samples)


def fewest_samples(bound: float = MAX_FAILURE_BOUND, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose every pass bounds the failure rate at ``bound`` (29 for 10 %)."""
    return math.ceil(math.log(1 - confidence) / math.log(1 - bound))
