"""Folding an inference-mode BatchNorm2d into the Conv2d before it (Chapter 1). Pairs come from the traced
dataflow, never module names; float64 arithmetic, cast back, matches ``bn(conv(x))`` to float32 rounding."""
from __future__ import annotations

import copy
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx, nn


class FoldingError(ValueError):
    """A Conv2d/BatchNorm2d pair that cannot be folded, with the reason."""


# >>> taught on chapters/01_chef_and_refrigerator.ipynb: edit it there, then run scripts/export_taught_code.py
def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new Conv2d equal to ``bn(conv(x))`` for an eval-mode ``bn``; neither input is modified."""
    if not isinstance(conv, nn.Conv2d) or not isinstance(bn, nn.BatchNorm2d):
        raise FoldingError(f"expected a Conv2d and a BatchNorm2d, got {type(conv).__name__} and {type(bn).__name__}")
    if bn.training:
        raise FoldingError("the BatchNorm2d is in training mode, where it normalises with each batch's own "
                           "statistics; call .eval() before folding")
    if bn.running_mean is None:
        raise FoldingError("the BatchNorm2d keeps no running statistics, so it is no fixed affine map")
    if bn.num_features != conv.out_channels:
        raise FoldingError(f"channel mismatch: {conv.out_channels} conv outputs, {bn.num_features} BN channels")
    f64 = lambda t, default: t.detach().double() if t is not None else default
    mean, var = bn.running_mean.double(), bn.running_var.double()
    gamma, beta = f64(bn.weight, torch.ones_like(mean)), f64(bn.bias, torch.zeros_like(mean))
    bias = f64(conv.bias, torch.zeros_like(mean))
    scale = gamma / torch.sqrt(var + bn.eps)                               # s
    folded = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                       padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=True,
                       padding_mode=conv.padding_mode, device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        folded.weight.copy_(conv.weight.double() * scale.reshape(-1, 1, 1, 1))   # W' = s W
        folded.bias.copy_(scale * (bias - mean) + beta)                         # b' = s (b - mu) + beta
    return folded.train(conv.training)
# <<< end of the code taught on chapters/01_chef_and_refrigerator.ipynb


def _is_plain_conv(module: nn.Module) -> bool:
    """True for nn.Conv2d and subclasses inheriting its forward; a subclass with its own forward may differ."""
    return (isinstance(module, nn.Conv2d) and not getattr(module, "transposed", False)
            and type(module).forward is nn.Conv2d.forward and type(module)._conv_forward is nn.Conv2d._conv_forward)


class _ConvLeafTracer(fx.Tracer):
    """torch.fx's tracer, keeping a user-defined plain Conv2d subclass one call, as it keeps nn.Conv2d."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return _is_plain_conv(module) or super().is_leaf_module(module, qualified_name)


@dataclass
class FoldPlan:
    """The foldable ``(conv_path, bn_path)`` pairs, ``(bn_path, reason)`` for each BN skipped, and the tracer used."""

    pairs: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    tracer: str = ""


@dataclass
class _Call:
    """One module call in a traced graph: which module, its first tensor input, how many users."""

    path: str
    module: nn.Module
    source: object  # the graph node that feeds the call (first argument)
    node: object
    users: int


def _fx_calls(module: nn.Module) -> tuple[list[_Call], dict[str, int], set[str]]:
    """Module calls of a ``torch.fx`` trace of ``module`` (Conv2d, its plain subclasses and BN stay leaf calls)."""
    try:
        traced = fx.GraphModule(module, _ConvLeafTracer().trace(module))
    except Exception as error:  # TraceError, or a forward that inspects its input (x.dim(), shapes)
        raise FoldingError(
            f"torch.fx could not trace the model's forward ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:120]}); pass example_inputs so that the dataflow is traced "
            "with torch.export instead") from None
    modules = dict(traced.named_modules())
    calls, counts, attribute_uses = [], Counter(), set()
    for node in traced.graph.nodes:
        if node.op == "call_module":
            counts[node.target] += 1
            source = node.args[0] if node.args else None
            calls.append(_Call(node.target, modules[node.target], source, node, len(node.users)))
        elif node.op == "get_attr":  # a parameter or buffer used outside its module's own call
            attribute_uses.add(node.target.rpartition(".")[0])
    return calls, counts, attribute_uses


def _module_path(node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else None


def _export_calls(module: nn.Module, example_inputs: tuple) -> tuple[list[_Call], dict[str, int], set[str]]:
    """Conv2d and BatchNorm2d calls of a ``torch.export`` graph of ``module`` on ``example_inputs``."""
    try:
        program = torch.export.export(module, tuple(example_inputs))
    except Exception as error:
        raise FoldingError(f"torch.export could not trace the model on the example inputs "
                           f"({type(error).__name__}: {str(error).splitlines()[0][:160]})") from None
    modules = dict(module.named_modules())
    # string padding ("same", "valid") traces to its own overload
    conv_ops = {torch.ops.aten.conv2d.default, torch.ops.aten.conv2d.padding, torch.ops.aten.convolution.default}
    bn_ops = {torch.ops.aten.batch_norm.default,
              torch.ops.aten._native_batch_norm_legit_no_training.default}
    signature = program.graph_signature
    param_owner = {placeholder: name.rpartition(".")[0] for placeholder, name in
                   {**signature.inputs_to_parameters, **signature.inputs_to_buffers}.items()}
    calls, counts, attribute_uses = [], Counter(), set()
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in param_owner:
            owner = param_owner[node.name]
            for user in node.users:  # a parameter read by anything but its own module's op
                if user.target not in conv_ops | bn_ops or _module_path(user) != owner:
                    attribute_uses.add(owner)
        if node.op != "call_function" or node.target not in conv_ops | bn_ops:
            continue
        path = _module_path(node)
        if path is None or path not in modules:
            continue
        counts[path] += 1
        users = len(node.users)
        if node.target is torch.ops.aten._native_batch_norm_legit_no_training.default:
            users = sum(len(u.users) for u in node.users)  # through getitem(..., 0)
        calls.append(_Call(path, modules[path], node.args[0], node, users))
    return calls, counts, attribute_uses


def conv_bn_plan(module: nn.Module, example_inputs: tuple | None = None) -> FoldPlan:
    """The Conv2d -> BatchNorm2d pairs the traced dataflow allows to fold. A forward that branches on shape
    (BlurBall checks ``x.dim()``) needs ``example_inputs``, to trace with ``torch.export`` instead of ``torch.fx``."""
    if not isinstance(module, nn.Module):
        raise FoldingError(f"expected an nn.Module, got {type(module).__name__}")
    if example_inputs is None:
        calls, counts, attribute_uses = _fx_calls(module)
        tracer = "torch.fx"
    else:
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        calls, counts, attribute_uses = _export_calls(module, example_inputs)
        tracer = "torch.export"
    by_node = {id(call.node): call for call in calls}
    instances = Counter(id(sub) for _, sub in module.named_modules(remove_duplicate=False))
    plan = FoldPlan(tracer=tracer)
    for call in calls:
        if not isinstance(call.module, nn.BatchNorm2d):
            continue
        producer = by_node.get(id(call.source))
        reason = None
        if producer is None or not _is_plain_conv(producer.module):
            reason = "its input is not the output of a Conv2d call"
        elif producer.users != 1:
            reason = f"the output of {producer.path!r} has {producer.users} users, not only this BN"
        elif counts[producer.path] != 1 or counts[call.path] != 1:
            reason = f"{producer.path!r} or {call.path!r} is called more than once in forward"
        elif instances[id(producer.module)] != 1 or instances[id(call.module)] != 1:
            reason = f"{producer.path!r} or {call.path!r} is registered under more than one name"
        elif producer.path in attribute_uses or call.path in attribute_uses:
            reason = "a parameter or buffer of the pair is read outside the module's own call"
        if reason is None:
            plan.pairs.append((producer.path, call.path))
        else:
            plan.skipped.append((call.path, reason))
    return plan


def _set_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new) if not name.isdigit() else parent._modules.__setitem__(name, new)


def fold_all_conv_bn(module: nn.Module, example_inputs: tuple | None = None) -> tuple[nn.Module, int]:
    """``(folded deep copy, number of folds)``: each folded BN becomes ``nn.Identity``, the model's class kept. Warns
    when BN calls were found and none folded: a fold that silently does nothing looks like success."""
    plan = conv_bn_plan(module, example_inputs)
    if plan.skipped and not plan.pairs:
        reasons = sorted({reason for _, reason in plan.skipped})
        warnings.warn(f"folded none of the {len(plan.skipped)} BatchNorm2d calls ({plan.tracer}): "
                      + "; ".join(reasons), stacklevel=2)
    folded_model = copy.deepcopy(module)
    for conv_path, bn_path in plan.pairs:
        conv = folded_model.get_submodule(conv_path)
        bn = folded_model.get_submodule(bn_path)
        _set_submodule(folded_model, conv_path, fold_conv_bn(conv, bn))
        _set_submodule(folded_model, bn_path, nn.Identity())
    return folded_model, len(plan.pairs)
