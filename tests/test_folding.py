"""Tests of Conv2d + BatchNorm2d folding (graphbook.folding)."""
import pytest
import torch
from torch import nn

from graphbook.folding import FoldingError, fold_all_conv_bn, fold_conv_bn


def _random_bn(channels, affine=True):
    bn = nn.BatchNorm2d(channels, affine=affine)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.2, 3.0)
        if affine:
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-1, 1)
    return bn.eval()


def _max_relative_error(expected, actual):
    return ((expected - actual).abs().max() / expected.abs().max()).item()


CONV_CASES = [
    dict(in_channels=3, out_channels=8, kernel_size=3, padding=1, bias=False),
    dict(in_channels=3, out_channels=8, kernel_size=3, padding=1, bias=True),
    dict(in_channels=8, out_channels=16, kernel_size=3, groups=4, padding=1),
    dict(in_channels=8, out_channels=8, kernel_size=3, groups=8, bias=False),  # depthwise
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1),
    dict(in_channels=4, out_channels=6, kernel_size=3, dilation=2, padding=2, bias=False),
    dict(in_channels=4, out_channels=6, kernel_size=(1, 3), padding=(0, 1), padding_mode="reflect"),
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, padding_mode="circular", bias=False),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_folded_conv_matches_conv_then_bn(case, affine):
    torch.manual_seed(0)
    conv = nn.Conv2d(**case).eval()
    bn = _random_bn(case["out_channels"], affine=affine)
    x = torch.randn(2, case["in_channels"], 17, 23)
    with torch.no_grad():
        expected = bn(conv(x))
        folded = fold_conv_bn(conv, bn)
        actual = folded(x)
    assert actual.shape == expected.shape
    assert _max_relative_error(expected, actual) < 1e-5
    assert folded.bias is not None
    for attribute in ("stride", "padding", "dilation", "groups", "padding_mode"):
        assert getattr(folded, attribute) == getattr(conv, attribute)


def test_folding_leaves_inputs_untouched():
    conv, bn = nn.Conv2d(3, 4, 3), _random_bn(4)
    weight, mean = conv.weight.clone(), bn.running_mean.clone()
    fold_conv_bn(conv, bn)
    assert torch.equal(conv.weight, weight) and torch.equal(bn.running_mean, mean)
    assert conv.bias is not None and isinstance(bn, nn.BatchNorm2d)


def test_fold_is_not_identity():
    # the test above could pass if fold returned the conv unchanged and bn were identity; make sure not
    conv, bn = nn.Conv2d(3, 4, 3), _random_bn(4)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(conv(x), fold_conv_bn(conv, bn)(x), atol=1e-3)


def test_training_mode_bn_is_refused():
    bn = _random_bn(4).train()
    with pytest.raises(FoldingError, match="training mode"):
        fold_conv_bn(nn.Conv2d(3, 4, 3), bn)


def test_bn_without_running_stats_is_refused():
    bn = nn.BatchNorm2d(4, track_running_stats=False).eval()
    with pytest.raises(FoldingError, match="running statistics"):
        fold_conv_bn(nn.Conv2d(3, 4, 3), bn)


def test_channel_mismatch_is_refused():
    with pytest.raises(FoldingError, match="channel mismatch.*5.*4|channel mismatch"):
        fold_conv_bn(nn.Conv2d(3, 5, 3), _random_bn(4))


@pytest.mark.parametrize("conv, bn", [
    (nn.Linear(3, 4), _random_bn(4)),
    (nn.ConvTranspose2d(3, 4, 3), _random_bn(4)),
    (nn.Conv1d(3, 4, 3), _random_bn(4)),
    (nn.Conv2d(3, 4, 3), nn.BatchNorm1d(4).eval()),
    (nn.Conv2d(3, 4, 3), nn.LayerNorm(4)),
])
def test_wrong_module_types_are_refused(conv, bn):
    with pytest.raises(FoldingError, match="expected"):
        fold_conv_bn(conv, bn)


def test_folding_error_is_a_value_error():
    assert issubclass(FoldingError, ValueError)


class _NamedBlock(nn.Module):
    """A residual block with the conv1/bn1, conv2/bn2 naming convention."""

    def __init__(self, channels):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), _random_bn(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), _random_bn(channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


def _model():
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), _random_bn(8), nn.ReLU()),
        _NamedBlock(8),
        nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU(), _random_bn(8)),  # BN after ReLU: not a pair
        nn.Conv2d(8, 2, 1),
    ).eval()


def test_fold_all_finds_sequential_and_named_pairs():
    model = _model()
    folded, count = fold_all_conv_bn(model)
    assert count == 3
    remaining = sum(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert remaining == 1  # the BN behind a ReLU stays
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 4  # original untouched
    x = torch.randn(2, 3, 16, 20)
    with torch.no_grad():
        expected, actual = model(x), folded(x)
    assert _max_relative_error(expected, actual) < 1e-5


def test_fold_all_refuses_training_models_and_non_modules():
    with pytest.raises(FoldingError, match="training mode"):
        fold_all_conv_bn(_model().train())
    with pytest.raises(FoldingError, match="nn.Module"):
        fold_all_conv_bn("not a model")


def test_fold_all_without_pairs_counts_zero():
    folded, count = fold_all_conv_bn(nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU()))
    assert count == 0 and isinstance(folded[0], nn.Conv2d)
