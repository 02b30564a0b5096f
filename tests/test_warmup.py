"""graphbook.measure.warmup: the tiny model's contract and the argument checks (Chapter 6 runs the rest live)."""
import pytest
import torch

from graphbook.measure import warmup

CHW = (9, 8, 12)


@pytest.fixture(scope="module")
def net():
    torch.set_num_threads(1)
    return warmup.tiny_clip_net(hidden=4)


def test_tiny_clip_net_keeps_blurball_contract_and_logits_of_reads_every_output(net):
    out = net(torch.randn(2, *CHW))
    assert out.shape == (2, 3, 8, 12)
    assert not net.training
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
    lambda n: warmup.serve_random_sequence(n, CHW, (1,), requests=0),
])
@pytest.mark.slow
def test_bad_arguments_raise_value_error(net, call):
    with pytest.raises(ValueError):
        call(net)
