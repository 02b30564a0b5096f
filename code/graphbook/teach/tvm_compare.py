"""Real TVM (Apache TVM's Relax; optional, x86-64 Linux wheels) as the referee of the book's fusion rules
(Chapter 3): groups are read after ``FuseOps``, before ``FuseTIR`` merges them, and set beside the book's."""
from __future__ import annotations

import collections
import importlib.util
import time
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch

from graphbook.model import blurball
from graphbook.teach import fusion_rules as fr

# The book's ATen op names and the TIR function names TVM's legalization gives the same operators.
_BOOK_TO_TVM = {"linear": "matmul", "mul": "multiply", "unsqueeze": "expand_dims",
                "upsample_nearest2d": "resize2d", "mean": "mean"}


def _tvm_installed() -> bool:
    return importlib.util.find_spec("tvm") is not None


def tvm_status() -> tuple[bool, str]:
    """``(True, "apache-tvm X")`` when TVM imports here, else ``(False, why)``."""
    if not _tvm_installed():
        return False, ("apache-tvm is not installed (optional: pip install -r requirements-tvm.txt; wheels "
                       "exist for x86-64 Linux only)")
    try:
        import tvm
        from tvm.relax.frontend.torch import from_exported_program
    except Exception as error:  # a broken install, or a platform without the native library
        return False, f"apache-tvm is installed but does not import: {type(error).__name__}: {error}"
    return True, f"apache-tvm {tvm.__version__}"


def _require_tvm():
    ok, why = tvm_status()
    if not ok:
        raise RuntimeError(why)


@dataclass(frozen=True)
class TVMGroup:
    """One kernel TVM's FuseOps planned: its name and the TIR functions it calls, in order."""

    name: str
    ops: tuple[str, ...]

    @property
    def composition(self) -> str:
        return " + ".join(self.ops)


def relax_module(model: torch.nn.Module, example: torch.Tensor, program=None):
    """A model as a Relax IRModule via ``torch.export``, parameters as constants for ``FoldConstant`` (as deployed)."""
    _require_tvm()
    from tvm.relax.frontend.torch import from_exported_program

    if program is None:
        program = torch.export.export(model.eval(), (example,))
    return from_exported_program(program, keep_params_as_input=False)


def _tir_name(gvar_name: str) -> str:
    """``conv2d1`` -> ``conv2d``: LegalizeOps numbers repeated TIR functions."""
    base = gvar_name.rstrip("0123456789")
    return base.rstrip("_") or gvar_name


def fuse(mod, decompose_bn: bool = False):
    """The IRModule after TVM's fusion planning (``FuseOps``, before ``FuseTIR``)."""
    _require_tvm()
    import tvm
    from tvm import relax

    # CanonicalizeBindings folds the (out, mean, var)[0] that decomposed batch norm leaves behind; without
    # it the tuple cuts every conv -> BN -> ReLU chain before the ReLU.
    passes = [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings()] \
        if decompose_bn else []
    passes += [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
               relax.transform.FoldConstant(), relax.transform.FuseOps()]
    return tvm.transform.Sequential(passes)(mod)


def _call_tir_callees(expr) -> list[str]:
    """Names of the TIR functions ``call_tir`` calls in a Relax function body, in order."""
    from tvm import relax

    names = []

    def visit(node):
        if isinstance(node, relax.Call) and getattr(node.op, "name", "") == "relax.call_tir":
            names.append(node.args[0].name_hint)

    relax.analysis.post_order_visit(expr, visit)
    return names


def fused_groups(mod) -> list[TVMGroup]:
    """The kernels ``main`` launches after FuseOps: a fused function or one TIR call."""
    from tvm import relax

    groups = []

    def visit(node):
        if not isinstance(node, relax.Call):
            return
        if getattr(node.op, "name", "") == "relax.call_tir":
            name = node.args[0].name_hint
            groups.append(TVMGroup(name, (_tir_name(name),)))
        elif isinstance(node.op, relax.GlobalVar):
            func = mod[node.op]
            if isinstance(func, relax.Function):
                ops = tuple(_tir_name(n) for n in _call_tir_callees(func.body))
                groups.append(TVMGroup(node.op.name_hint, ops))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return groups


def op_patterns(mod) -> dict[str, str]:
    """TIR function -> the pattern class ``AnnotateTIROpPattern`` gave it."""
    from tvm import tirx as tir

    names = {0: "elementwise", 1: "broadcast", 2: "injective", 3: "comm_reduce", 4: "out_elemwise_fusable",
             7: "tuple", 8: "opaque"}
    patterns = {}
    for gvar, func in mod.functions.items():
        attrs = getattr(func, "attrs", None)
        if attrs is not None and "op_pattern" in attrs:
            patterns[_tir_name(gvar.name_hint)] = names.get(int(attrs["op_pattern"]), str(attrs["op_pattern"]))
    return patterns


# ------------------------------------------------------------------------------ the book's side
def _book_groups(model: torch.nn.Module, example: torch.Tensor, program=None) -> tuple[list, list]:
    """The book's fusion groups as ``(live, dead)``: a dead group never reaches the output, so a compiler drops it."""
    if program is None:
        gm = fr.capture_aten_graph(model, (example,))
    else:
        gm = program.graph_module
        gm.meta["user_inputs"] = list(program.graph_signature.user_inputs)
    groups = fr.fuse_groups(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    live, stack = set(), [output]
    while stack:
        node = stack.pop()
        for parent in node.all_input_nodes:
            if parent.name not in live:
                live.add(parent.name)
                stack.append(parent)
    reached = [any(n in live for n in g.nodes) for g in groups]
    return [g for g, r in zip(groups, reached) if r], [g for g, r in zip(groups, reached) if not r]


def _kind(ops: Sequence[str]) -> str:
    """A coarse label both sides share: which heavy operator anchors the group."""
    ops = [_BOOK_TO_TVM.get(op, op) for op in ops]
    if "conv2d" in ops:
        return "conv2d + epilogue" if len(ops) > 1 else "conv2d alone"
    if "matmul" in ops:
        return "linear (matmul) + epilogue" if len(ops) > 1 else "linear (matmul) alone"
    if "mean" in ops:
        return "mean (reduction)"
    if "batch_norm" in ops:
        return "batch_norm, no conv"
    if "resize2d" in ops:
        return "upsample + element-wise"
    return "element-wise only"


@dataclass
class Comparison:
    """The book's groups and TVM's, counted and explained."""

    book_live: int
    book_dead: int
    tvm_default: int
    tvm_decomposed: int
    relax_ops: int
    by_kind: "object"            # DataFrame: kind x (book live, book dead, TVM default, TVM + decompose)
    compositions: "object"       # DataFrame: the most frequent compositions on each side
    differences: list[dict]      # one row per kind of difference: what, number, why
    tvm_version: str
    input_shape: tuple
    seconds: dict                # where the time went: export, book rules, TVM import, each pipeline
    counts: dict                 # side -> {composition: number of groups}, what the test pins


def compare(height: int = 32, width: int = 64, model: torch.nn.Module | None = None) -> Comparison:
    """BlurBall through the book's rules and TVM's two pipelines side by side, at a small input."""
    _require_tvm()
    from tvm import relax

    model = model if model is not None else blurball.build_blurball()
    example = blurball.example_input(height=height, width=width)
    seconds, clock = {}, time.perf_counter()

    def lap(name):
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = round(now - clock, 2)
        clock = now

    program = torch.export.export(model.eval(), (example,))   # one export serves both sides
    lap("torch.export")
    live, dead = _book_groups(model, example, program)
    lap("book rules")
    mod = relax_module(model, example, program)
    relax_ops = sum(isinstance(binding.value, relax.Call) for block in mod["main"].body.blocks
                    for binding in block.bindings)
    lap("TVM import (from_exported_program)")
    default_mod = fuse(mod, decompose_bn=False)
    default = fused_groups(default_mod)
    lap("TVM default pipeline")
    decomposed_mod = fuse(mod, decompose_bn=True)
    decomposed = fused_groups(decomposed_mod)
    lap("TVM + DecomposeOpsForInference")

    sides = {side: collections.Counter(_kind(g.ops) for g in groups) for side, groups in (
        ("book, live", live), ("book, dead", dead), ("TVM default", default),
        ("TVM + DecomposeOpsForInference", decomposed))}
    kinds = sorted(set().union(*sides.values()))
    by_kind = pd.DataFrame({side: [counts.get(k, 0) for k in kinds] for side, counts in sides.items()},
                           index=pd.Index(kinds, name="group anchored by"))
    by_kind.loc["total"] = by_kind.sum()

    compositions = pd.concat([
        _top("book (live)", [" + ".join(_BOOK_TO_TVM.get(o, o) for o in g.ops) for g in live]),
        _top("TVM default", [g.composition for g in default]),
        _top("TVM + DecomposeOpsForInference", [g.composition for g in decomposed])], axis=1)

    patterns = op_patterns(default_mod)
    lone_conv = sum(1 for g in default if g.ops == ("conv2d",))
    bn_alone = sum(1 for g in default if "batch_norm" in g.ops and "conv2d" not in g.ops)
    se_split = sum(1 for g in decomposed if g.ops and g.ops[0] == "expand_dims")
    se_merged = sum(1 for g in decomposed if g.ops and g.ops[0] == "expand_dims" and "resize2d" in g.ops)
    book_se_tails = sum(1 for g in live if "unsqueeze" in g.ops)
    differences = [
        {"difference": "dead stage-4 outputs", "number": len(dead),
         "why": f"TVM's frontend drops the nodes that never reach the output; the book's rules group all "
                f"of them, so {len(dead)} of its {len(live) + len(dead)} groups are dead ({len(live)} live)."},
        {"difference": "BN not absorbed by its conv (default pipeline)", "number": lone_conv,
         "why": f"LegalizeOps turns batch_norm into a TIR function classed {patterns.get('batch_norm', '?')!r}; "
                f"FuseOps fuses an out-elementwise-fusable conv2d only with element-wise/broadcast "
                f"consumers, so {lone_conv} conv2d kernels stand alone and {bn_alone} groups start at a "
                f"batch_norm. The paper (and the book's table) class inference BN as a per-channel "
                f"scale and shift, which the conv absorbs."},
        {"difference": "SE tail split at expand_dims (decomposed pipeline)", "number": se_split,
         "why": f"With DecomposeOpsForInference the convs absorb BN and ReLU, but expand_dims (classed "
                f"{op_patterns(decomposed_mod).get('expand_dims', '?')!r}) starts a new group: "
                f"{se_split} groups begin with expand_dims where the book has {book_se_tails} SE-tail "
                f"groups holding the unsqueeze with the linear's sigmoid; {se_merged} of them also takes "
                f"the upsample chain that follows, which the book keeps apart."},
        {"difference": "kernels, all told", "number": len(decomposed) - len(live),
         "why": f"book {len(live)} live groups; TVM {len(default)} kernels by default and "
                f"{len(decomposed)} with DecomposeOpsForInference = {len(live)} + {se_split} SE splits - "
                f"{se_merged} merge{'s' if se_merged != 1 else ''}"
                + (" (accounted for)" if len(decomposed) == len(live) + se_split - se_merged
                   else f" does not add up: {len(live) + se_split - se_merged}") + "."},
    ]
    return Comparison(len(live), len(dead), len(default), len(decomposed), relax_ops, by_kind, compositions,
                      differences, tvm_status()[1], tuple(example.shape), seconds, {
                          "book_live": dict(collections.Counter(" + ".join(g.ops) for g in live)),
                          "book_dead": dict(collections.Counter(" + ".join(g.ops) for g in dead)),
                          "tvm_default": dict(collections.Counter(g.composition for g in default)),
                          "tvm_decomposed": dict(collections.Counter(g.composition for g in decomposed))})


def _top(label: str, compositions: Sequence[str], n: int = 8):
    counts = collections.Counter(compositions).most_common(n)
    return pd.DataFrame({f"{label}": [c for c, _ in counts], f"{label} n": [k for _, k in counts]})
