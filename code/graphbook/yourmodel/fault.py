"""A planted fault that shows what a check can see (Chapter 8): a copy of the model with one residual summand
dropped, the kind of wrong output torch 2.13's freezing produced, or, in a model without a residual add, one
convolution's output scaled. A check that passes this copy would pass that miscompile too."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from graphbook.method.variants import arguments

_ADDS = (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor)
#: The scale put on one convolution's output when the model has no residual add.
CONV_SCALE = 0.9


@dataclass
class Fault:
    """The faulty copy ``model`` and what was planted: ``kind`` ("dropped summand" or "scaled convolution") and
    ``where`` (the node or the module)."""

    model: nn.Module
    kind: str
    where: str


def _residual_adds(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """``a + b`` of two computed tensors of one shape: a residual join, not a bias or a constant added."""
    def computed(arg) -> bool:
        return (isinstance(arg, torch.fx.Node) and arg.op not in ("get_attr", "placeholder")
                and isinstance(arg.meta.get("val"), torch.Tensor))
    found = []
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _ADDS and len(node.args) >= 2:
            a, b = node.args[:2]
            if computed(a) and computed(b) and a.meta["val"].shape == b.meta["val"].shape:
                found.append(node)
    return found


def _drop_summand(model: nn.Module, example) -> Fault | None:
    """The model exported (``torch.export``, non-strict) with the second summand of its middle residual add left
    out; None when the graph has no residual add."""
    program = torch.export.export(model, arguments(example), strict=False)
    module = program.module()
    adds = _residual_adds(module.graph)
    if not adds:
        return None
    node = adds[len(adds) // 2]
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    module_path = stack[-1][0] if stack and stack[-1][0] else "the model's forward"
    where = f"{node.name} in {module_path} ({len(adds) // 2 + 1} of {len(adds)} residual adds)"
    node.replace_all_uses_with(node.args[0])
    module.graph.erase_node(node)
    module.recompile()
    return Fault(module, "dropped summand", where)


def _scale_convolution(model: nn.Module) -> Fault:
    """A copy whose middle convolution's output is scaled by :data:`CONV_SCALE`; ValueError without a convolution."""
    faulty = copy.deepcopy(model)
    convs = [(name, m) for name, m in faulty.named_modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if not convs:
        raise ValueError("the model has neither a residual add nor a convolution to plant a fault in")
    name, conv = convs[len(convs) // 2]
    conv.register_forward_hook(lambda module, inputs, output: output * CONV_SCALE)
    return Fault(faulty, "scaled convolution", f"{name} ({len(convs) // 2 + 1} of {len(convs)} convolutions)")


def plant(model: nn.Module, example) -> Fault:
    """A dropped residual summand where the model has one, else a scaled convolution."""
    return _drop_summand(model, example) or _scale_convolution(model)
