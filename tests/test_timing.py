"""Tests of the timing harness (graphbook.measure.timing)."""
import time

import pytest
import torch

from graphbook.measure import timing


def _turns(calls):
    """The names in the order they took turns: the Timer calls a name several times in its turn."""
    return [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]


def test_time_cpu_makes_exactly_its_calls_from_a_millisecond_up_and_blocks_below_and_restores_threads():
    calls = []
    result = timing.time_cpu(lambda: calls.append(time.sleep(0.005)), warmup=3, repeats=10)
    # sleep never returns early; a generous upper bound because the machine is shared
    assert 4.5 <= result.median_ms < 1000 and result.repeats == 10 and result.warmup == 3 and len(calls) == 3 + 10
    assert result.min_ms <= result.q1_ms <= result.median_ms <= result.q3_ms <= result.max_ms
    calls.clear()
    assert timing.time_cpu(lambda: calls.append(time.sleep(0.005)), warmup=1, repeats=1).repeats == 3
    assert len(calls) == 1 + 3   # a median and a spread need three readings
    calls.clear()
    tiny = timing.time_cpu(lambda: calls.append(None), warmup=1, repeats=5)
    assert tiny.repeats >= 3 and len(calls) > 100   # a call far below the clock's resolution is timed in blocks
    before = torch.get_num_threads()
    seen = set()
    timing.time_cpu(lambda: seen.add(torch.get_num_threads()), warmup=0, repeats=1, threads=1)
    assert seen == {1} and torch.get_num_threads() == before
    if before > 1:
        timing.time_cpu(lambda: seen.add(torch.get_num_threads()), warmup=0, repeats=1)
        assert seen == {1, before}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_time_cpu_times_gpu_work():
    a = torch.rand(512, 512, device="cuda")
    assert timing.time_cpu(lambda: a @ a, warmup=2, repeats=5).median_ms > 0


def test_interleaved_and_the_timing_modes_take_turns_pin_threads_or_hand_over_to_a_measure():
    calls = []
    timed = timing.interleaved({"first": lambda: calls.append("a"), "second": lambda: calls.append("b")},
                               warmup=1, repeats=3)
    assert calls == ["a", "b"] * 4  # a warm-up call each, then exactly one call each per round
    assert [(name, t.repeats, t.warmup) for name, t in timed.items()] == [("first", 3, 1), ("second", 3, 1)]
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    rows = timing.repeated_runs(list(fns), timing.in_turns(fns, warmup=0, repeats=2), runs=2)
    # run 1: a warm-up call each, then two rounds: a b a b a b; run 2, rotated: b a b a b a
    assert calls == ["a", "b"] * 3 + ["b", "a"] * 3 and "copy_gbps" not in rows[0]
    seen = []
    rows = timing.repeated_runs(["a", "b"], lambda order, index: {n: seen.append((n, index)) or {"score": index}
                                                                 for n in order}, runs=2)
    assert seen == [("a", 0), ("b", 0), ("b", 1), ("a", 1)] and [r["score"] for r in rows] == [0, 0, 1, 1]
    before, threads = torch.get_num_threads(), {}
    one = {"one": lambda: threads.setdefault("one", torch.get_num_threads())}
    timing.repeated_runs(["one"], timing.one_by_one(one, warmup=0, repeats=1, threads={"one": 1}), runs=1)
    assert threads == {"one": 1} and torch.get_num_threads() == before


def test_repeated_runs_rotates_round_robin_each_group_on_its_own_and_probes_every_run(monkeypatch):
    from graphbook.measure import probes

    probed = []
    monkeypatch.setattr(probes, "copy_bandwidth", lambda nbytes, repeats: probed.append(nbytes) or {"gb_per_s": 7.0})
    calls, log = [], []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    copy = timing.copy_probe(1024)
    rows = timing.repeated_runs(list(fns), timing.one_by_one(fns, warmup=0, repeats=1), runs=3,
                                probe=lambda: {**copy(), "peak": 1.0}, log=log.append)
    assert probed == [1024] * 3 and _turns(calls) == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [r["went_first"] for r in rows[::3]] == ["a", "b", "c"]
    assert [(r["run"], r["run_order"], r["variant"]) for r in rows[:3]] == [(1, 1, "a"), (1, 2, "b"), (1, 3, "c")]
    assert all(r["copy_gbps"] == 7.0 and r["peak"] == 1.0 and r["run_count"] == 3 and r["median_ms"] >= 0
               for r in rows)
    assert log[0].startswith("run 1/3: copy_ 7.0 GB/s, order a, b, c")
    names = ["a", "b", "c"]
    orders = [timing.rotated(names, run) for run in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert {order[0] for order in orders[:3]} == set(names)  # every name goes first once in len(names) runs
    assert timing.rotated([], 2) == [] and names == ["a", "b", "c"]
    calls = {name: (lambda: None) for name in ("a", "b", "x", "y", "z")}
    rows = timing.repeated_runs(list(calls), timing.one_by_one(calls, warmup=0, repeats=1), runs=3,
                                groups=[["a", "b"], ["x", "y", "z"]])
    orders = [[r["variant"] for r in rows if r["run"] == k] for k in (1, 2, 3)]
    assert orders == [["a", "b", "x", "y", "z"], ["b", "a", "y", "z", "x"], ["a", "b", "z", "x", "y"]]
