"""The book's decision rule is calibrated on real A/A blocks: it calls a tie *faster* at most 5 % of the time, and it
detects every lead at or above the minimum detectable lead it reports at least 80 % of the time. A check's pass on n
samples bounds its failure rate at 1 - 0.05**(1/n)."""
import itertools
import math
import random

import mpmath
import pytest
from graphbook.record import recording
from graphbook.record import verdict as v

RESAMPLES, BLOCKS = 2000, 5   # the finals' fewest blocks


@pytest.fixture(scope="module")
def aa_log_ratios():
    """Every ordered pair of eager blocks in one run of the reference recording's ablation (7 blocks a run, 3 runs):
    the same code timed against itself, under the same load as everything it is compared with."""
    ablation = recording.load("ablation")
    return [math.log(b / a) for _, run in ablation.groupby("run")
            for a, b in itertools.permutations(run["eager_median_ms"], 2)]


def _draws(log_ratios, seed=0):
    rng = random.Random(seed)
    return [[rng.choice(log_ratios) for _ in range(BLOCKS)] for _ in range(RESAMPLES)]


def _upper_bound(successes, trials, confidence=0.95):
    """Clopper-Pearson's one-sided upper bound of a binomial rate."""
    return float(mpmath.findroot(lambda p: mpmath.betainc(successes + 1, trials - successes, 0, p, regularized=True)
                                 - confidence, (successes / trials, 1.0), solver="illinois"))


def test_the_rule_calls_a_tie_faster_at_most_5_percent_of_the_time(aa_log_ratios):
    assert len(aa_log_ratios) == 3 * 7 * 6
    faster = sum(v.compare(draw).outcome == v.FASTER for draw in _draws(aa_log_ratios))
    assert faster / RESAMPLES <= 0.05 and _upper_bound(faster, RESAMPLES) <= 0.07, faster


@pytest.mark.parametrize("above", [1.0, 1.1, 1.5])
def test_the_rule_detects_every_lead_at_or_above_its_minimum_detectable_lead_80_percent_of_the_time(aa_log_ratios,
                                                                                                  above):
    detected = 0
    for draw in _draws(aa_log_ratios, seed=1):
        planted = math.log(v.compare(draw).detectable_lead * above)   # the lead it says it would detect, injected
        detected += v.compare([d + planted for d in draw]).outcome == v.FASTER
    assert detected / RESAMPLES >= v.POWER, detected


@pytest.mark.parametrize("ratios, noise, outcome", [
    ([math.log(1.20), math.log(1.15), math.log(1.25)], None, v.FASTER),
    ([0.01, -0.01, 0.0], (0.02, 30), v.WITHIN),
    ([0.01, -0.01, 0.0], (0.10, 30), v.CANT_TELL),          # the same pairs, a noisier screen: no verdict
    ([math.log(1.004)] * 2 + [math.log(1.05)], (0.065, 30), v.CANT_TELL),
])
def test_three_outcomes(ratios, noise, outcome):
    found = v.compare(ratios, **({} if noise is None else {"noise": noise[0], "noise_df": noise[1]}))
    assert found.outcome == outcome and found.lead_low < found.lead < found.lead_high
    assert found.detectable_lead > 1 + v.PRACTICAL_BAND


def test_t_quantiles_and_the_bound_a_passing_check_gives():
    assert v.t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert v.t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)
    assert v.t_quantile(0.2, 10) == pytest.approx(-v.t_quantile(0.8, 10))
    # the matrix's 48 hard frames, the your-model BlurBall run's 12, Chapter 8's live 4
    assert [round(v.failure_bound(n), 3) for n in (48, 12, 4)] == [0.061, 0.221, 0.527]
    assert v.failure_bound(0) == 1.0 and v.failure_bound(300) == pytest.approx(3 / 300, rel=0.01)   # rule of three
    with pytest.raises(ValueError, match="pooled noise"):
        v.compare([0.1])


def test_a_lower_precision_verdict_needs_29_check_samples_to_bound_its_failures_at_10_percent():
    assert v.fewest_samples() == 29
    assert v.failure_bound(29) <= v.MAX_FAILURE_BOUND < v.failure_bound(28)
