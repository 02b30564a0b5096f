"""Recompilation counting, warm-up and the zero-recompile proof (graphbook.measure.warmup, Chapter 6).

Counting graphs only needs Dynamo's guards, not Inductor's code generation, so most tests compile
with ``backend="eager"`` (milliseconds); one test runs the real Inductor path end to end.
"""
import pytest
import torch

from graphbook.config import BATCH_SIZES
from graphbook.measure import warmup

CHW = (9, 8, 12)


@pytest.fixture(scope="module")
def net():
    torch.set_num_threads(1)
    return warmup.tiny_clip_net(hidden=4)


def test_tiny_clip_net_keeps_blurball_contract(net):
    out = net(torch.randn(2, *CHW))
    assert out.shape == (2, 3, 8, 12)
    assert not net.training


@pytest.mark.parametrize("strategy, expected_flags", [
    ("static", [True, True, True]),      # one graph per distinct batch size
    ("automatic", [True, True, False]),  # static 1, then one dynamic graph that also covers 3
    ("mark_dynamic", [True, True, False]),  # size 1 is specialised anyway; 2 gets the dynamic graph
])
def test_count_compiles_per_strategy(net, strategy, expected_flags):
    rows = warmup.count_compiles(net, CHW, BATCH_SIZES, strategy, backend="eager")
    assert [r["compiled"] for r in rows] == expected_flags
    assert rows[-1]["graphs_total"] == sum(expected_flags)
    assert [r["batch_size"] for r in rows] == list(BATCH_SIZES)
    assert all(r["seconds"] >= 0 for r in rows)


def test_repeated_sizes_compile_nothing_new(net):
    rows = warmup.count_compiles(net, CHW, (1, 2, 3, 2, 1, 3), "static", backend="eager")
    assert [r["compiled"] for r in rows] == [True, True, True, False, False, False]


def test_incomplete_warm_up_is_caught_by_fail_on_recompile(net):
    torch._dynamo.reset()
    compiled = warmup.compile_for(net, "static", backend="eager")
    warmup.warm_up(compiled, CHW, (1,))
    with pytest.raises(RuntimeError, match="recompile"):
        warmup.serve_random_sequence(compiled, CHW, (1, 2), requests=10, seed=1)


@pytest.mark.slow
def test_complete_warm_up_serves_without_recompiles_inductor(net):
    torch._dynamo.reset()
    compiled = warmup.compile_for(net, "automatic")
    seconds = warmup.warm_up(compiled, CHW, BATCH_SIZES)
    assert sorted(seconds) == list(BATCH_SIZES)
    served = warmup.serve_random_sequence(compiled, CHW, BATCH_SIZES, requests=30, seed=0)
    assert served == {"requests": 30, "sizes_seen": [1, 2, 3], "new_graphs": 0}
    with torch.no_grad():
        x = torch.randn(3, *CHW)
        assert torch.allclose(compiled(x), net(x), atol=1e-4)


def test_logits_of_accepts_tensor_dict_and_list():
    t = torch.zeros(1, 3, 2, 2)
    assert warmup.logits_of(t) is t
    assert warmup.logits_of({0: t}) is t
    assert warmup.logits_of([t]) is t
    with pytest.raises(TypeError, match="logits"):
        warmup.logits_of("not a tensor")


@pytest.mark.parametrize("call", [
    lambda n: warmup.compile_for(n, "sometimes"),
    lambda n: warmup.count_compiles(n, CHW, (0, 1)),
    lambda n: warmup.warm_up(n, CHW, ()),
    lambda n: warmup.warm_up(n, CHW, (1,), calls_per_size=0),
    lambda n: warmup.serve_random_sequence(n, CHW, (1,), requests=0),
])
def test_bad_arguments_raise_value_error(net, call):
    with pytest.raises(ValueError):
        call(net)
