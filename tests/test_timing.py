"""Tests of the timing harness (graphbook.record.timing)."""
import time

import pytest
import torch

from graphbook.record import timing


def test_summarize_median_quartiles_and_spread():
    result = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0], name="x", warmup=2)
    assert result.median_ms == 3.0
    assert (result.min_ms, result.max_ms) == (1.0, 5.0)
    assert (result.q1_ms, result.q3_ms) == (2.0, 4.0)
    assert result.iqr_ms == 2.0
    assert result.repeats == 5 and result.warmup == 2 and result.device == "cpu"
    assert result.as_dict()["name"] == "x"


def test_summarize_single_sample_and_empty():
    one = timing.summarize([7.0])
    assert one.median_ms == one.q1_ms == one.q3_ms == 7.0
    with pytest.raises(ValueError, match="at least one sample"):
        timing.summarize([])


def test_time_cpu_counts_warmup_and_repeats():
    calls = []
    result = timing.time_cpu(lambda: calls.append(1), warmup=2, repeats=5, name="append")
    assert len(calls) == 7
    assert result.repeats == 5 and result.warmup == 2 and result.name == "append"
    assert result.min_ms <= result.q1_ms <= result.median_ms <= result.q3_ms <= result.max_ms


def test_time_cpu_measures_a_sleep():
    result = timing.time_cpu(lambda: time.sleep(0.01), warmup=0, repeats=3)
    # sleep never returns early; a generous upper bound because the machine is shared
    assert 9.5 <= result.median_ms < 1000


def test_time_cpu_sets_and_restores_threads():
    before = torch.get_num_threads()
    seen = []
    timing.time_cpu(lambda: seen.append(torch.get_num_threads()), warmup=0, repeats=1, threads=1)
    assert seen == [1]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("kwargs, message", [
    ({"repeats": 0}, "repeats"), ({"warmup": -1}, "warmup"), ({"repeats": 2.5}, "repeats"),
    ({"repeats": True}, "repeats")])
def test_time_cpu_rejects_bad_counts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        timing.time_cpu(lambda: None, **kwargs)


def test_time_cpu_rejects_non_callable():
    with pytest.raises(TypeError, match="callable"):
        timing.time_cpu(42)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_time_cuda_without_cuda_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.time_cuda(lambda: None)
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.time_fn(lambda: None, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_time_cuda_times_gpu_work():
    a = torch.rand(512, 512, device="cuda")
    result = timing.time_cuda(lambda: a @ a, warmup=2, repeats=5)
    assert result.device == "cuda" and result.median_ms > 0


def test_time_fn_dispatch():
    assert timing.time_fn(lambda: None, device="cpu", warmup=0, repeats=2).device == "cpu"
    with pytest.raises(ValueError, match="device"):
        timing.time_fn(lambda: None, device="tpu")


def test_alternating_timing_returns_two_results_in_order():
    calls = []
    a, b = timing.alternating_timing(lambda: calls.append("a"), lambda: calls.append("b"), warmup=1,
                                 repeats=3, names=("first", "second"))
    assert calls == ["a", "b"] * 4
    assert (a.name, b.name, a.repeats, b.repeats) == ("first", "second", 3, 3)
    with pytest.raises(ValueError, match="repeats"):
        timing.alternating_timing(lambda: None, lambda: None, repeats=0)


def test_rotated_is_round_robin():
    names = ["a", "b", "c"]
    orders = [timing.rotated(names, run) for run in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert {order[0] for order in orders[:3]} == set(names)  # every name goes first once in len(names) runs
    assert timing.rotated([], 2) == [] and names == ["a", "b", "c"]
