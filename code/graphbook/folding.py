"""Folding an inference-mode BatchNorm2d into the Conv2d before it (Chapter 1).

At inference a BatchNorm2d is a fixed per-channel affine map,
``bn(z) = gamma * (z - mean) / sqrt(var + eps) + beta``. Applied to a convolution's output
``z = W * x + b`` it can be moved into the convolution itself: with ``s = gamma / sqrt(var + eps)``
the folded convolution has ``W' = s * W`` (each output channel's filter scaled) and
``b' = s * (b - mean) + beta``. The BN operation, and the memory round trip it costs, disappear.

The arithmetic is done in float64 and cast back to the convolution's dtype, so the folded layer
matches ``bn(conv(x))`` to float32 rounding.
"""
from __future__ import annotations

import copy

import torch
from torch import nn


class FoldingError(ValueError):
    """A Conv2d/BatchNorm2d pair that cannot be folded, with the reason (Chapter 1)."""


def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new Conv2d equal to ``bn(conv(x))`` for an eval-mode ``bn`` (Chapter 1).

    Keeps the convolution's stride, padding, padding_mode, dilation and groups; the result always
    has a bias. Neither input is modified. Raises :class:`FoldingError` when ``conv`` is not a
    Conv2d (a ConvTranspose2d's weight layout differs), ``bn`` is not a BatchNorm2d, ``bn`` is in
    training mode (it would normalise with the batch's statistics, not fixed ones), ``bn`` keeps no
    running statistics, or the channel counts differ.
    """
    if not _is_plain_conv(conv):
        raise FoldingError(f"expected an nn.Conv2d to fold into, got {type(conv).__name__}")
    if not isinstance(bn, nn.BatchNorm2d):
        raise FoldingError(f"expected an nn.BatchNorm2d to fold, got {type(bn).__name__}")
    if bn.training:
        raise FoldingError("the BatchNorm2d is in training mode, where it normalises with each batch's "
                           "own statistics; call .eval() on the model before folding")
    if bn.running_mean is None or bn.running_var is None:
        raise FoldingError("the BatchNorm2d has no running statistics (track_running_stats=False), so "
                           "it is not a fixed affine map and cannot be folded")
    if bn.num_features != conv.out_channels:
        raise FoldingError(f"channel mismatch: the Conv2d has {conv.out_channels} output channels but "
                           f"the BatchNorm2d normalises {bn.num_features}")
    weight = conv.weight.detach().to(torch.float64)
    mean = bn.running_mean.detach().to(torch.float64)
    var = bn.running_var.detach().to(torch.float64)
    gamma = (bn.weight.detach().to(torch.float64) if bn.weight is not None
             else torch.ones_like(mean))
    beta = bn.bias.detach().to(torch.float64) if bn.bias is not None else torch.zeros_like(mean)
    bias = conv.bias.detach().to(torch.float64) if conv.bias is not None else torch.zeros_like(mean)

    scale = gamma / torch.sqrt(var + bn.eps)
    folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                       padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=True,
                       padding_mode=conv.padding_mode, device=conv.weight.device,
                       dtype=conv.weight.dtype)
    with torch.no_grad():
        folded.weight.copy_((weight * scale.reshape(-1, 1, 1, 1)).to(conv.weight.dtype))
        folded.bias.copy_((scale * (bias - mean) + beta).to(conv.weight.dtype))
    folded.train(conv.training)
    return folded


def _is_plain_conv(module: nn.Module) -> bool:
    """True for nn.Conv2d and subclasses that keep its weight layout (not quantized/transposed)."""
    return isinstance(module, nn.Conv2d) and not getattr(module, "transposed", False)


def _pair_suffix(name: str, prefix: str) -> str | None:
    return name[len(prefix):] if name.startswith(prefix) else None


def fold_all_conv_bn(module: nn.Module) -> tuple[nn.Module, int]:
    """A deep copy of ``module`` with every recognised Conv2d -> BatchNorm2d pair folded (Chapter 1).

    Returns ``(folded_copy, number_of_folds)``; the original is untouched. Each folded BN is
    replaced by ``nn.Identity`` and its conv by the folded conv. Two patterns are recognised, in
    every submodule at any depth:

    1. **Sequential neighbours** -- inside an ``nn.Sequential``, a Conv2d immediately followed by a
       BatchNorm2d (e.g. ``Sequential(conv, bn, relu)``).
    2. **Named pairs** -- direct children named ``conv<S>`` and ``bn<S>`` with the same suffix ``<S>``
       (``conv1``/``bn1``, ``conv2``/``bn2``, ``conv``/``bn``), where ``conv<S>`` is a Conv2d and
       ``bn<S>`` a BatchNorm2d. This trusts the naming convention that ``forward`` applies
       ``bn<S>`` directly to ``conv<S>``'s output; nothing else is inferred from ``forward``.

    Anything else (a BN after a non-conv, a BN reached through functional calls) is left alone.
    Compare the folded model's output with the original's before using it. Raises
    :class:`FoldingError` if a recognised pair cannot be folded (e.g. the model is in training mode).
    """
    if not isinstance(module, nn.Module):
        raise FoldingError(f"expected an nn.Module, got {type(module).__name__}")
    folded_model = copy.deepcopy(module)
    count = 0
    for parent in list(folded_model.modules()):
        if isinstance(parent, nn.Sequential):
            names = list(parent._modules)
            for first, second in zip(names, names[1:]):
                conv, bn = parent._modules[first], parent._modules[second]
                if _is_plain_conv(conv) and isinstance(bn, nn.BatchNorm2d):
                    parent._modules[first] = fold_conv_bn(conv, bn)
                    parent._modules[second] = nn.Identity()
                    count += 1
        children = dict(parent.named_children())
        for name, conv in children.items():
            suffix = _pair_suffix(name, "conv")
            if suffix is None or not _is_plain_conv(conv):
                continue
            bn = children.get("bn" + suffix)
            if isinstance(bn, nn.BatchNorm2d):
                setattr(parent, name, fold_conv_bn(conv, bn))
                setattr(parent, "bn" + suffix, nn.Identity())
                count += 1
    return folded_model, count
