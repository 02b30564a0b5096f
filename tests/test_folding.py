"""Tests of Conv2d + BatchNorm2d folding (graphbook.method.folding)."""
import pytest
import torch
from torch import nn

from graphbook.config import FLOAT32_ROUNDING, FOLD_RTOL
from graphbook.method.folding import FoldingError, conv_bn_plan, fold_all_conv_bn, fold_conv_bn


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
def test_folded_conv_matches_conv_then_bn_and_torchs_own_fold(case, affine):
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    torch.manual_seed(0)
    conv = nn.Conv2d(**case).eval()
    bn = _random_bn(case["out_channels"], affine=affine)
    weight, mean = conv.weight.clone(), bn.running_mean.clone()
    x = torch.randn(2, case["in_channels"], 17, 23)
    with torch.no_grad():
        expected = bn(conv(x))
        folded = fold_conv_bn(conv, bn)
        actual = folded(x)
        assert not torch.allclose(conv(x), actual, atol=1e-3)  # the fold is not the conv alone
    assert actual.shape == expected.shape and _max_relative_error(expected, actual) < FOLD_RTOL
    for attribute in ("stride", "padding", "dilation", "groups", "padding_mode"):
        assert getattr(folded, attribute) == getattr(conv, attribute)
    assert torch.equal(conv.weight, weight) and torch.equal(bn.running_mean, mean)  # its inputs are left as they were
    if affine:
        torchs = fuse_conv_bn_eval(conv, bn)
        assert torch.allclose(folded.weight, torchs.weight, rtol=FOLD_RTOL, atol=FLOAT32_ROUNDING)
        assert torch.allclose(folded.bias, torchs.bias, rtol=FOLD_RTOL, atol=FLOAT32_ROUNDING)


@pytest.mark.parametrize("conv, bn, message", [
    (nn.Conv2d(3, 4, 3), _random_bn(4).train(), "training mode"),
    (nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False).eval(), "running statistics"),
    (nn.Conv2d(3, 5, 3), _random_bn(4), "channel mismatch"),
    (nn.Linear(3, 4), _random_bn(4), "expected"),
    (nn.ConvTranspose2d(3, 4, 3), _random_bn(4), "expected"),
    (nn.Conv1d(3, 4, 3), _random_bn(4), "expected"),
    (nn.Conv2d(3, 4, 3), nn.BatchNorm1d(4).eval(), "expected"),
    (nn.Conv2d(3, 4, 3), nn.LayerNorm(4), "expected"),
])
def test_a_pair_that_cannot_be_folded_is_refused(conv, bn, message):
    with pytest.raises(FoldingError, match=message):
        fold_conv_bn(conv, bn)


def test_fold_all_refuses_training_models_and_non_modules():
    with pytest.raises(FoldingError, match="training mode"):
        fold_all_conv_bn(nn.Sequential(nn.Conv2d(3, 4, 1), _random_bn(4)).train())
    with pytest.raises(FoldingError, match="nn.Module"):
        fold_all_conv_bn("not a model")


# --- Whole-model folding follows the traced dataflow, not module names ------------------------------

class _NamesLie(nn.Module):
    """Names and dataflow disagree: bn1 normalises the input *before* conv1, and conv2's output goes
    into bn3, not bn2. A name-based folder would fold conv1/bn1 and conv2/bn2 and change the output."""

    def __init__(self, channels=6):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1), _random_bn(channels)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1), _random_bn(channels)
        self.bn3 = _random_bn(channels)

    def forward(self, x):
        y = self.conv1(self.bn1(x))
        return self.bn3(self.conv2(y)) + self.bn2(y)


class _ReversedSequential(nn.Sequential):
    """A Sequential whose forward runs its children backwards: neighbours in the list are not neighbours
    in the dataflow."""

    def forward(self, x):
        for layer in reversed(list(self)):
            x = layer(x)
        return x


class _SharedUses(nn.Module):
    """A conv whose output is also read by the residual, and a conv module called twice."""

    def __init__(self, channels=6):
        super().__init__()
        self.conv_a, self.bn_a = nn.Conv2d(channels, channels, 1), _random_bn(channels)
        self.conv_b, self.bn_b = nn.Conv2d(channels, channels, 1), _random_bn(channels)

    def forward(self, x):
        y = self.conv_a(x)
        z = self.bn_a(y) + y               # conv_a's output has two users
        return self.bn_b(self.conv_b(z)) + self.conv_b(x)   # conv_b is called twice


class _ChecksShape(nn.Module):
    """A forward that inspects its input's shape, like BlurBall: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 3, padding=1), _random_bn(4)

    def forward(self, x):
        if x.dim() != 4:
            raise ValueError("expected NCHW")
        return self.bn(self.conv(x))


def _outputs(model, folded, x):
    with torch.no_grad():
        return model(x), folded(x)


def test_names_that_lie_are_not_trusted():
    torch.manual_seed(3)
    model = _NamesLie().eval()
    folded, count = fold_all_conv_bn(model)
    assert count == 1                                   # conv2 -> bn3, the only real pair
    assert isinstance(folded.bn3, nn.Identity)
    assert isinstance(folded.bn1, nn.BatchNorm2d) and isinstance(folded.bn2, nn.BatchNorm2d)
    expected, actual = _outputs(model, folded, torch.randn(2, 6, 9, 11))
    assert _max_relative_error(expected, actual) < FOLD_RTOL


def test_neighbours_in_a_sequential_are_not_trusted():
    torch.manual_seed(4)
    model = _ReversedSequential(nn.Conv2d(4, 4, 3, padding=1), _random_bn(4), nn.Conv2d(4, 4, 1)).eval()
    # dataflow: conv(1x1) -> bn -> conv(3x3): the BN follows the 1x1 conv, the list's *next* item
    plan = conv_bn_plan(model)
    assert plan.pairs == [("2", "1")]
    folded, count = fold_all_conv_bn(model)
    expected, actual = _outputs(model, folded, torch.randn(1, 4, 8, 8))
    assert count == 1 and _max_relative_error(expected, actual) < FOLD_RTOL


def test_shared_outputs_and_modules_called_twice_are_skipped():
    torch.manual_seed(5)
    model = _SharedUses().eval()
    plan = conv_bn_plan(model)
    assert plan.pairs == []
    reasons = dict(plan.skipped)
    assert "2 users" in reasons["bn_a"] and "more than once" in reasons["bn_b"]
    with pytest.warns(UserWarning, match="folded none of the 2 BatchNorm2d calls"):
        folded, count = fold_all_conv_bn(model)
    expected, actual = _outputs(model, folded, torch.randn(1, 6, 5, 5))
    assert count == 0 and torch.equal(expected, actual)


@pytest.mark.slow  # exports with torch.export
def test_untraceable_forward_needs_example_inputs_and_export_and_fx_plans_agree():
    model = _ChecksShape().eval()
    with pytest.raises(FoldingError, match="example_inputs"):
        fold_all_conv_bn(model)
    x = torch.randn(1, 3, 8, 8)
    folded, count = fold_all_conv_bn(model, (x,))
    assert conv_bn_plan(model, (x,)).tracer == "torch.export"
    expected, actual = _outputs(model, folded, x)
    assert count == 1 and _max_relative_error(expected, actual) < FOLD_RTOL
    # where both trace, the two tracers find the same pairs
    model = _NamesLie().eval()
    x = torch.randn(1, 6, 7, 7)
    fx_plan, export_plan = conv_bn_plan(model), conv_bn_plan(model, (x,))
    assert fx_plan.tracer == "torch.fx" and export_plan.tracer == "torch.export"
    assert sorted(fx_plan.pairs) == sorted(export_plan.pairs) == [("conv2", "bn3")]
    shared = _SharedUses().eval()
    assert conv_bn_plan(shared, (torch.randn(1, 6, 4, 4),)).pairs == []


class _DepthwiseConv(nn.Conv2d):
    """A depthwise convolution as model libraries write it: a Conv2d subclass that inherits forward."""

    def __init__(self, channels, kernel_size, stride, padding):
        super().__init__(channels, channels, kernel_size, stride, padding=padding, groups=channels, bias=False)


class _MBConv(nn.Module):
    """EfficientNet's block: expand 1x1, depthwise, squeeze-excite, project 1x1; BN after each conv; string
    padding ("valid" after explicit zero padding where strided, "same" elsewhere)."""

    def __init__(self, cin, cout, expand, kernel, stride):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, padding="same", bias=False), _random_bn(mid), nn.SiLU())
        self.pad = nn.ZeroPad2d((kernel // 2 - 1, kernel // 2, kernel // 2 - 1, kernel // 2)) if stride == 2 \
            else nn.Identity()
        self.depthwise = _DepthwiseConv(mid, kernel, stride, "valid" if stride == 2 else "same")
        self.depthwise_bn, self.act = _random_bn(mid), nn.SiLU()
        self.squeeze, self.excite = nn.Conv2d(mid, max(1, cin // 4), 1), nn.Conv2d(max(1, cin // 4), mid, 1)
        self.project = nn.Conv2d(mid, cout, 1, padding="same", bias=False)
        self.project_bn = _random_bn(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        h = self.act(self.depthwise_bn(self.depthwise(self.pad(self.expand(x)))))
        h = h * torch.sigmoid(self.excite(nn.functional.silu(self.squeeze(h.mean((2, 3), keepdim=True)))))
        h = self.project_bn(self.project(h))
        return h + x if self.residual else h


def _efficientnet_style():
    torch.manual_seed(7)
    return nn.Sequential(
        nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(3, 8, 3, stride=2, padding="valid", bias=False), _random_bn(8), nn.SiLU(),
        _MBConv(8, 8, 1, 3, 1), _MBConv(8, 12, 4, 3, 2), _MBConv(12, 12, 4, 5, 1),
        nn.Conv2d(12, 32, 1, padding="same", bias=False), _random_bn(32), nn.SiLU()).eval()


@pytest.mark.parametrize("traced_with_inputs", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["torch.fx", "torch.export"])
def test_an_efficientnet_style_model_folds_every_pair(traced_with_inputs):
    model, x = _efficientnet_style(), torch.randn(1, 3, 32, 32)
    folded, count = fold_all_conv_bn(model, (x,) if traced_with_inputs else None)
    assert count == sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 11
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    expected, actual = _outputs(model, folded, x)
    assert torch.allclose(expected, actual, rtol=1e-4, atol=1e-5)


class _SamePaddingConv(nn.Conv2d):
    """A subclass with its own forward (padding computed per input): it is not a plain Conv2d."""

    def forward(self, x):
        return super().forward(nn.functional.pad(x, (1, 1, 1, 1), value=1.0))


@pytest.mark.slow  # exports with torch.export
def test_a_fold_that_finds_no_pair_says_so_and_a_conv_with_its_own_forward_is_not_folded():
    model = nn.Sequential(_SamePaddingConv(3, 4, 3), _random_bn(4)).eval()
    x = torch.randn(1, 3, 8, 8)
    for inputs in (None, (x,)):
        with pytest.warns(UserWarning, match="folded none of the 1 BatchNorm2d calls"):
            folded, count = fold_all_conv_bn(model, inputs)
        assert count == 0 and torch.equal(*_outputs(model, folded, x))
