"""What a model is made of and what one forward costs: modules, parameters, MACs (to turn times into GFLOP/s
against the machine's ceiling, and to count the dead stage-4 work)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from graphbook.model.blurball import DEAD_MODULE_PREFIXES


def module_counts(model: nn.Module) -> dict[str, int]:
    """How many modules of each class, e.g. ``{"Conv2d": 72, ...}``."""
    return dict(Counter(type(module).__name__ for module in model.modules()))


def parameter_count(model: nn.Module) -> int:
    """Learnable parameters (BN running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters())


def macs_by_module(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """MACs of each Conv2d and Linear (not element-wise work) in one forward of ``x``, by module name, from hooks."""
    counts: dict[str, int] = {}
    handles = []

    def hook(name):
        def record(module, inputs, output):
            if isinstance(module, nn.Conv2d):
                kh, kw = module.kernel_size
                per_output = (module.in_channels // module.groups) * kh * kw
            else:
                per_output = module.in_features
            counts[name] = counts.get(name, 0) + int(output.numel()) * per_output
        return record

    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return counts


@dataclass(frozen=True)
class ModelCost:
    """Parameter count and per-forward MACs of a model at one input size."""

    parameters: int
    macs: int
    dead_macs: int
    input_shape: tuple

    @property
    def gflop(self) -> float:
        """Billions of floating-point operations per forward, counting 2 per MAC."""
        return 2 * self.macs / 1e9


def model_cost(model: nn.Module, x: torch.Tensor) -> ModelCost:
    """Parameters, total MACs and the MACs of never-read stage-4 outputs."""
    per_module = macs_by_module(model, x)
    dead = sum(v for k, v in per_module.items() if k.startswith(DEAD_MODULE_PREFIXES))
    return ModelCost(parameters=parameter_count(model), macs=int(sum(per_module.values())),
                     dead_macs=int(dead), input_shape=tuple(x.shape))
