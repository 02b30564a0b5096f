"""TVM's operator classes and ``FuseOps`` rules (Chen et al., OSDI 2018) applied to PyTorch FX graphs (Chapter 3).
Unknown operators are opaque. Not TVM itself: no ``max_fuse_depth``, no tuples, node classes for edge patterns."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

import pandas as pd
import torch
import torch.fx


class OpClass(str, Enum):
    """TVM's four operator classes."""

    INJECTIVE = "injective"
    REDUCTION = "reduction"
    COMPLEX_OUT_FUSABLE = "complex-out-fusable"
    OPAQUE = "opaque"


# The table. Element-wise and broadcast operators (TVM's kElemWise/kBroadcast): inference-mode batch
# norm is a per-channel scale and shift, and views that add or drop size-1 axes move no data.
ELEMENTWISE_OPS = frozenset({
    "abs", "add", "addcdiv", "addcmul", "alias", "batch_norm", "bitwise_and", "bitwise_not", "bitwise_or", "ceil",
    "clamp", "clamp_max", "clamp_min", "clip", "clone", "copy", "cos", "cosh", "detach", "div", "dropout", "elu", "eq",
    "erf", "exp", "exp2", "expand", "expand_as", "expm1", "fill", "float", "floor", "floordiv", "full_like", "ge",
    "gelu", "getitem", "gt", "half", "hardsigmoid", "hardswish", "hardtanh", "identity", "le", "leaky_relu", "lerp",
    "log", "log10", "log1p", "log2", "logical_and", "logical_not", "logical_or", "lt", "masked_fill", "maximum",
    "minimum", "mish", "mul", "ne", "neg", "ones_like", "pow", "reciprocal", "relu", "relu6", "round", "rsqrt",
    "sigmoid", "sign", "silu", "sin", "sinh", "softplus", "sqrt", "square", "squeeze", "sub", "tan", "tanh", "to",
    "truediv", "type_as", "unsqueeze", "where", "zeros_like", "_native_batch_norm_legit_no_training", "_to_copy",
})
# Injective but not element-wise (TVM's kInjective): they move data around.
OTHER_INJECTIVE_OPS = frozenset({
    "_unsafe_index", "_unsafe_view", "as_strided", "cat", "channel_shuffle", "concat", "constant_pad_nd", "contiguous",
    "embedding", "flatten", "flip", "gather", "index", "index_select", "interpolate", "narrow", "pad", "permute",
    "pixel_shuffle", "pixel_unshuffle", "repeat", "reshape", "roll", "select", "slice", "split", "split_with_sizes",
    "stack", "t", "take", "tile", "transpose", "unbind", "unflatten", "upsample_bilinear2d", "upsample_nearest1d",
    "upsample_nearest2d", "upsample_nearest3d", "view",
})
REDUCTION_OPS = frozenset({
    "all", "amax", "amin", "any", "argmax", "argmin", "logsumexp", "linalg_vector_norm", "max", "mean", "min", "norm",
    "prod", "std", "std_mean", "sum", "var", "var_mean",
})
# Heavy operators that accept an element-wise epilogue. TVM registers conv2d, dense and the pooling
# operators with this pattern.
COMPLEX_OUT_FUSABLE_OPS = frozenset({
    "_adaptive_avg_pool2d", "_convolution", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
    "addmm", "avg_pool1d", "avg_pool2d", "avg_pool3d", "baddbmm", "bmm", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution", "linear", "matmul", "max_pool1d",
    "max_pool2d", "max_pool2d_with_indices", "max_pool3d", "mm",
})
# Listed so they count as *known* opaque operators rather than unknown ones. TVM registers softmax
# and sorting as opaque; normalisations over a whole row are left opaque here for the same reason.
OPAQUE_OPS = frozenset({
    "_local_scalar_dense", "_softmax", "argsort", "cumsum", "group_norm", "item", "layer_norm", "log_softmax",
    "masked_select", "native_group_norm", "native_layer_norm", "nonzero", "scaled_dot_product_attention", "softmax",
    "sort", "topk", "unique",
})
# ``max``/``min`` with two tensors (``aten.maximum`` style overloads) are element-wise, not reductions.
_BINARY_OVERLOADS = {"other", "binary", "out"}

# Module classes in a graph that still has ``call_module`` nodes (FX symbolic tracing, older Dynamo).
_MODULE_OP_NAMES = {
    "AdaptiveAvgPool2d": "adaptive_avg_pool2d", "AvgPool2d": "avg_pool2d",
    "BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm", "BatchNorm3d": "batch_norm",
    "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d",
    "ConvTranspose2d": "conv_transpose2d", "Dropout": "dropout", "Flatten": "flatten",
    "GELU": "gelu", "Hardswish": "hardswish", "Identity": "identity", "LayerNorm": "layer_norm",
    "LeakyReLU": "leaky_relu", "Linear": "linear", "MaxPool2d": "max_pool2d", "ReLU": "relu",
    "ReLU6": "relu6", "SiLU": "silu", "Sigmoid": "sigmoid", "Softmax": "softmax", "Tanh": "tanh",
}

# Ordering used by the fusion rules (TVM's OpPatternKind order).
ELEMWISE, INJECTIVE, REDUCTION, COMPLEX, OPAQUE = range(5)
CLASS_OF_LEVEL = {ELEMWISE: OpClass.INJECTIVE, INJECTIVE: OpClass.INJECTIVE,
                   REDUCTION: OpClass.REDUCTION, COMPLEX: OpClass.COMPLEX_OUT_FUSABLE,
                   OPAQUE: OpClass.OPAQUE}
_COMPUTE_OPS = ("call_function", "call_method", "call_module")
#: Python's augmented assignments as Dynamo records them (``operator.iadd``), by the operator they compute.
_PYTHON_IN_PLACE = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "truediv"}


@dataclass(frozen=True)
class NodeInfo:
    """One compute node with its TVM class (``elementwise`` refines injective; ``known`` False: opaque fallback)."""

    name: str
    op: str
    op_class: OpClass
    elementwise: bool
    known: bool


@dataclass(frozen=True)
class FusionGroup:
    """Nodes TVM's rules compile into one kernel; ``kind`` is the strongest member class, ``anchor`` the first."""

    index: int
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    kind: OpClass
    anchor: str

    @property
    def size(self) -> int:
        return len(self.nodes)


def op_name(node: torch.fx.Node, root: torch.nn.Module | None = None) -> str:
    """The operator name of an FX node without namespace, overload or in-place suffix (``aten.relu_.default``
    -> ``relu``); a ``call_module`` node needs ``root`` to map its class."""
    if node.op == "call_module":
        if root is None:
            raise ValueError(f"node {node.name!r} calls a module; pass the GraphModule as root")
        module = root.get_submodule(str(node.target))
        cls = type(module).__name__
        if cls == "Upsample":
            return f"upsample_{getattr(module, 'mode', 'nearest')}2d"
        return _MODULE_OP_NAMES.get(cls, cls.lower())
    if node.op == "call_method":
        name = str(node.target)
    elif node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            target = target.overloadpacket
        name = getattr(target, "__name__", str(target))
    else:
        raise ValueError(f"node {node.name!r} is a {node.op!r} node, not a computation")
    # In-place variants (relu_, add_, Python's x += y) compute the same thing as their functional forms.
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return _PYTHON_IN_PLACE.get(name, name)


def classify_op(name: str, overload: str = "") -> tuple[OpClass, bool, bool]:
    """``(op_class, elementwise, known)`` from the table; unknown names are opaque with ``known=False``."""
    if name in ELEMENTWISE_OPS or (name in ("max", "min") and overload in _BINARY_OVERLOADS):
        return OpClass.INJECTIVE, True, True
    for ops, op_class in ((OTHER_INJECTIVE_OPS, OpClass.INJECTIVE), (REDUCTION_OPS, OpClass.REDUCTION),
                          (COMPLEX_OUT_FUSABLE_OPS, OpClass.COMPLEX_OUT_FUSABLE), (OPAQUE_OPS, OpClass.OPAQUE)):
        if name in ops:
            return op_class, False, True
    return OpClass.OPAQUE, False, False


def as_graph_module(graph) -> torch.fx.GraphModule:
    """The ``torch.fx.GraphModule`` of an FX graph or ExportedProgram; TypeError for anything else."""
    if isinstance(graph, torch.export.ExportedProgram):
        return graph.graph_module
    if isinstance(graph, torch.fx.GraphModule):
        return graph
    raise TypeError(f"expected a torch.fx.GraphModule or ExportedProgram, got {type(graph).__name__}")


def compute_nodes(graph) -> list[torch.fx.Node]:
    """The nodes that compute something, in graph order: no inputs, parameters, output or dead nodes."""
    gm = as_graph_module(graph)
    return [n for n in gm.graph.nodes if n.op in _COMPUTE_OPS and n.users]


def classify_graph(graph) -> list[NodeInfo]:
    gm = as_graph_module(graph)
    infos = []
    for node in compute_nodes(gm):
        name = op_name(node, gm)
        overload = node.target._overloadname if isinstance(node.target, torch._ops.OpOverload) else ""
        infos.append(NodeInfo(node.name, name, *classify_op(name, overload)))
    return infos


def unknown_ops(graph) -> list[str]:
    """Sorted operator names the table does not know (classified opaque by fallback)."""
    return sorted({info.op for info in classify_graph(graph) if not info.known})


def fusion_level(info: NodeInfo) -> int:
    if info.op_class is OpClass.INJECTIVE:
        return ELEMWISE if info.elementwise else INJECTIVE
    return {OpClass.REDUCTION: REDUCTION, OpClass.COMPLEX_OUT_FUSABLE: COMPLEX,
            OpClass.OPAQUE: OPAQUE}[info.op_class]


class UnionFind:
    """Union-find over node names; each root carries the group's strongest level."""

    def __init__(self, levels: dict[str, int]):
        self.parent = {name: name for name in levels}
        self.level = dict(levels)

    def find(self, name: str) -> str:
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def union_into(self, child: str, target: str) -> None:
        a, b = self.find(child), self.find(target)
        if a != b:
            self.parent[a] = b
            self.level[b] = max(self.level[a], self.level[b])


def post_dominators(order: list[str], users: dict[str, list[str]], escapes: set[str]) -> dict:
    """Immediate post-dominator of every node (None: only the graph output post-dominates it)."""
    ipdom: dict[str, str | None] = {}
    depth: dict[str | None, int] = {None: 0}

    def lca(a, b):
        while a != b:
            if a is None or b is None:
                return None
            if depth[a] >= depth[b]:
                a = ipdom[a]
            else:
                b = ipdom[b]
        return a

    for name in reversed(order):
        if name in escapes or not users[name]:
            ipdom[name] = None
        else:
            common = users[name][0]
            for other in users[name][1:]:
                common = lca(common, other)
            ipdom[name] = common
        depth[name] = depth[ipdom[name]] + 1
    return ipdom


# >>> taught on chapters/03_what_graph_compilers_do.ipynb: edit it there, then run scripts/export_taught_code.py
def fuse_groups(graph) -> list[FusionGroup]:
    """Group the compute nodes of a graph by TVM's fusion rules.

    Phase 0: a complex-out-fusable group absorbs its post-dominator when that is element-wise and every
    node on the way is element-wise; an element-wise group fuses into its post-dominator when that is
    injective or a reduction and the way there is injective. Phase 1: the other injective operators do
    the same. Reductions never fuse forward; opaque nodes never fuse. Returns the groups in graph order.
    """
    gm = as_graph_module(graph)
    nodes = compute_nodes(gm)
    infos = {info.name: info for info in classify_graph(gm)}
    names = [n.name for n in nodes]
    position = {name: k for k, name in enumerate(names)}
    compute = set(names)
    users = {n.name: [u.name for u in n.users if u.name in compute] for n in nodes}
    # A value that leaves the graph (or feeds a non-compute node) must be stored: it ends its group.
    escapes = {n.name for n in nodes if any(u.name not in compute for u in n.users)}
    ipdom = post_dominators(names, users, escapes)
    groups = UnionFind({name: fusion_level(infos[name]) for name in names})

    def paths_ok(src: str, sink: str, allowed) -> bool:
        seen: set[str] = set()
        stack = list(users[src])
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            level = groups.level[groups.find(name)]
            if name == sink:
                if not allowed(level, True):
                    return False
                continue
            if not allowed(level, False):
                return False
            stack.extend(users[name])
        return True

    def commit(src: str, sink: str) -> None:
        # Every node on a path from src to sink joins the sink's group.
        between = names[position[src]:position[sink] + 1]
        reachable = {src}
        for name in between:  # forward: descendants of src (graph order is topological)
            if name in reachable:
                reachable.update(users[name])
        reaches = {sink}
        for name in reversed(between):  # backward: those descendants that lead to sink
            if name in reachable and any(user in reaches for user in users[name]):
                reaches.add(name)
        for name in sorted(reaches, key=position.get):
            groups.union_into(name, sink)

    for phase in (0, 1):
        for name in names:
            dom = ipdom[name]
            if dom is None or groups.find(name) == groups.find(dom):
                continue
            level = groups.level[groups.find(name)]
            dom_level = fusion_level(infos[dom])
            if level == COMPLEX:
                if phase == 0 and dom_level == ELEMWISE and paths_ok(
                        name, dom, lambda lv, sink: lv <= ELEMWISE):
                    commit(name, dom)
            elif level == ELEMWISE:
                if dom_level <= INJECTIVE or dom_level == REDUCTION:
                    if paths_ok(name, dom, lambda lv, sink: lv != OPAQUE if sink else lv <= INJECTIVE):
                        commit(name, dom)
            elif level == INJECTIVE:
                if phase == 1 and paths_ok(name, dom, lambda lv, sink: lv <= INJECTIVE):
                    commit(name, dom)
            # reductions and opaque nodes never fuse forward

    members: dict[str, list[str]] = {}
    for name in names:
        members.setdefault(groups.find(name), []).append(name)
    result = []
    for index, group in enumerate(sorted(members.values(), key=lambda g: position[g[0]])):
        top = max(fusion_level(infos[m]) for m in group)
        anchor = next(m for m in group if fusion_level(infos[m]) == top)
        result.append(FusionGroup(index, tuple(group), tuple(infos[m].op for m in group),
                                  CLASS_OF_LEVEL[top], anchor))
    return result
# <<< end of the code taught on chapters/03_what_graph_compilers_do.ipynb


def fusion_summary(graph) -> dict:
    """Counts for one graph: compute nodes, nodes per class, unknown ops, groups."""
    infos = classify_graph(graph)
    groups = fuse_groups(graph)
    return {"nodes": len(infos), "groups": len(groups),
            **{cls.value: sum(i.op_class is cls for i in infos) for cls in OpClass},
            "unknown_ops": ", ".join(unknown_ops(graph)) or "-"}


def groups_table(groups: Iterable[FusionGroup], max_ops: int = 8):
    """One row per group: kind, anchor, size and its ops."""
    rows = [(g.index, g.kind.value, g.anchor, g.size,
             " -> ".join(g.ops[:max_ops]) + (" ..." if len(g.ops) > max_ops else "")) for g in groups]
    return pd.DataFrame(rows, columns=["group", "kind", "anchor", "nodes", "ops"])


def capture_aten_graph(model: torch.nn.Module, example_args: tuple) -> torch.fx.GraphModule:
    """``torch.export`` a model in eval mode into its ATen-level FX graph, not decomposed further: a conv or
    an inference BN stays one node, the granularity TVM's classes are defined at."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}; wrap a function in a Module")
    if not isinstance(example_args, tuple):
        raise TypeError("example_args must be a tuple of inputs, e.g. (x,)")
    model = model.eval()
    program = torch.export.export(model, example_args)
    gm = program.graph_module
    gm.meta["user_inputs"] = list(program.graph_signature.user_inputs)
    return gm
