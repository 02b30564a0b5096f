"""Delta debugging of the freezing miscompile, from a model to a few convolutions (appendix): PyTorch's minifier
cannot copy freezing's oneDNN weights. Each candidate runs in a fresh process under a time limit, since a compiler
bug can hang or crash its process and Inductor must not reuse the previous candidate's code."""
from __future__ import annotations

import math
import operator
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from graphbook.config import MISCOMPILE_ATOL, THREADS

FAILS, PASSES, TIMED_OUT, ERROR, SKIPPED = "fails", "passes", "timed out", "error", "skipped"


# ------------------------------------------------------------------------------------------ programs
@dataclass(frozen=True)
class Node:
    """One line of a program: ``name = <call>``; ``args`` name earlier nodes as ``("ref", name)``."""

    name: str
    kind: str            # "module" (target: constructor text), "function", "method"
    target: str
    args: tuple


@dataclass(frozen=True)
class Program:
    """A model as a list of nodes, its input shape and the nodes it returns."""

    nodes: tuple
    input_shape: tuple
    outputs: tuple
    shapes: dict = field(default_factory=dict, compare=False)   # node -> shape, measured once on capture

    def describe(self) -> str:
        convs = sum(n.kind == "module" and n.target.startswith("nn.Conv2d") for n in self.nodes)
        return (f"{len(self.nodes)} nodes, {convs} convolutions, input "
                f"{'x'.join(map(str, self.input_shape))}")


_MODULES = {nn.Conv2d: lambda m: (f"nn.Conv2d({m.in_channels}, {m.out_channels}, {m.kernel_size[0]}, "
                                  f"{m.stride[0]}, {m.padding[0]}, bias={m.bias is not None})"),
            nn.BatchNorm2d: lambda m: f"nn.BatchNorm2d({m.num_features})",
            nn.Linear: lambda m: f"nn.Linear({m.in_features}, {m.out_features}, bias={m.bias is not None})",
            nn.Upsample: lambda m: f"nn.Upsample(scale_factor={float(m.scale_factor)})",
            nn.ReLU: lambda m: "nn.ReLU()", nn.Sigmoid: lambda m: "nn.Sigmoid()", nn.Identity: lambda m: "nn.Identity()"}
_FUNCTIONS = {operator.add: "add", torch.relu: "torch.relu", torch.sigmoid: "torch.sigmoid",
              operator.getitem: "getitem", operator.mul: "mul"}


def capture(model: nn.Module, example: torch.Tensor) -> Program:
    """``model`` traced by ``torch.fx`` into a :class:`Program` with every node's shape; ValueError names an
    operator the reproducer does not know."""
    graph_module = torch.fx.symbolic_trace(model)
    ShapeProp(graph_module).propagate(example)
    nodes, shapes, output = [], {}, None
    modules = dict(graph_module.named_modules())

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("ref", a.name)
        if isinstance(a, (tuple, list)):
            return tuple(arg(x) for x in a)
        return a

    for fx in graph_module.graph.nodes:
        if fx.op == "placeholder":
            continue
        if fx.op == "output":
            returned = fx.args[0] if isinstance(fx.args[0], (tuple, list)) else (fx.args[0],)
            output = tuple(r.name for r in returned)
            continue
        if fx.op == "call_module":
            module = modules[fx.target]
            if type(module) not in _MODULES:
                raise ValueError(f"the minimizer does not know module {type(module).__name__} ({fx.target})")
            node = Node(fx.name, "module", _MODULES[type(module)](module), arg(fx.args))
        elif fx.op == "call_function" and fx.target in _FUNCTIONS:
            node = Node(fx.name, "function", _FUNCTIONS[fx.target], arg(fx.args))
        elif fx.op == "call_method" and fx.target == "mean":
            node = Node(fx.name, "method", "mean", arg(fx.args))
        else:
            raise ValueError(f"the minimizer does not know {fx.op} {fx.target}")
        nodes.append(node)
        meta = fx.meta.get("tensor_meta")
        shapes[fx.name] = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None
    first_input = next(n for n in graph_module.graph.nodes if n.op == "placeholder").name
    nodes = [replace(n, args=_map_refs(n.args, lambda r: "x" if r == first_input else r)) for n in nodes]
    return Program(tuple(nodes), tuple(example.shape), output, shapes)


def load_program(path: str | Path) -> Program:
    """A program back from a script :func:`to_source` wrote; only its class ``M`` is defined, nothing checked."""
    source = Path(path).read_text()
    shape = re.search(r"^model, x = M\(\)\.eval\(\), torch\.randn\(([\d, ]+)\)$", source, re.M)
    if "class M(nn.Module):" not in source or shape is None:
        raise ValueError(f"{path} is not a script written by the minimizer (no class M and input line)")
    scope: dict = {}
    exec(compile(source[:shape.start()], str(path), "exec"), scope)   # not "__main__": its usage guard stays quiet
    torch.manual_seed(0)
    return capture(scope["M"]().eval(), torch.randn(*map(int, shape.group(1).split(","))))


def _map_refs(args, fn):
    if isinstance(args, tuple) and len(args) == 2 and args[0] == "ref":
        return ("ref", fn(args[1]))
    if isinstance(args, tuple):
        return tuple(_map_refs(a, fn) for a in args)
    return args


def _refs(args) -> list[str]:
    if isinstance(args, tuple) and len(args) == 2 and args[0] == "ref":
        return [args[1]]
    if isinstance(args, tuple):
        return [r for a in args for r in _refs(a)]
    return []


def _expr(node: Node, fields: dict, inline: dict | None = None) -> str:
    def fmt(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "ref":
            return (inline or {}).get(a[1], a[1])
        if isinstance(a, slice):
            return ":" if a == slice(None) else repr(a)
        if isinstance(a, tuple):
            return "(" + ", ".join(fmt(x) for x in a) + ("," if len(a) == 1 else "") + ")"
        return repr(a)

    args = [fmt(a) for a in node.args]
    if node.kind == "module":
        return f"self.{fields[node.name]}({args[0]})"
    if node.kind == "method":
        return f"{args[0]}.{node.target}({', '.join(args[1:])})"
    if node.target == "add":
        return f"{args[0]} + {args[1]}"
    if node.target == "mul":
        return f"{args[0]} * {args[1]}"
    if node.target == "getitem":
        return f"{args[0]}[{', '.join(fmt(a) for a in node.args[1])}]"
    return f"{node.target}({', '.join(args)})"


def to_source(program: Program, *, threads: int = THREADS, atol: float = MISCOMPILE_ATOL, doc: str = "") -> str:
    """A standalone torch-only script that exits 1 while eager and ``freezing=True`` differ, 0 when they agree;
    ``doc`` is its docstring and ``--help``."""
    fields = {n.name: f"m{i}" for i, n in enumerate(n for n in program.nodes if n.kind == "module")}
    modules = [n for n in program.nodes if n.kind == "module"]
    # two modules per line, created left to right: the same order of seeded weights as one per line
    init = ["        " + ", ".join(f"self.{fields[n.name]}" for n in modules[i:i + 2]) + " = "
            + ", ".join(n.target for n in modules[i:i + 2]) for i in range(0, len(modules), 2)]
    body, inline = [], {}
    uses = Counter(r for n in program.nodes for r in _refs(n.args))
    for n, after in zip(program.nodes, [*program.nodes[1:], None]):
        text = _expr(n, fields, inline)
        # a value used once, by the very next line as its first input, is written inside that line:
        # Python evaluates it at the same point, so the traced graph (and Inductor's order) is unchanged
        if after is not None and uses.get(n.name) == 1 and n.name not in program.outputs \
                and _refs(after.args)[:1] == [n.name]:
            inline[n.name] = f"({text})" if n.target in ("add", "mul") else text
        else:
            body.append(f"        {n.name} = {text}")
    shape = ", ".join(map(str, program.input_shape))
    usage = [] if not doc else [
        "if __name__ == \"__main__\" and sys.argv[1:]:  # no options: --help prints the docstring, anything else exits 2",
        "    sys.exit(print('usage: ' + __doc__) if sys.argv[1:] in (['-h'], ['--help']) else print('error: no options', file=sys.stderr) or 2)"]
    return "\n".join([
        *([f'"""{doc}"""'] if doc else []),
        "import sys, torch", "from torch import nn", *(usage or [""]),
        f"torch.set_num_threads({threads}); torch.manual_seed(0)", "",
        "class M(nn.Module):", "    def __init__(self):", "        super().__init__()", *init, "",
        "    def forward(self, x):", *body, f"        return {', '.join(program.outputs)}", "",
        f"model, x = M().eval(), torch.randn({shape})",
        "with torch.no_grad():",
        "    expected = model(x)",
        "    with torch._inductor.config.patch(freezing=True):",
        "        actual = torch.compile(model)(x)",
        *(["diff = (actual - expected).abs().max().item()"] if len(program.outputs) == 1 else
          ["diff = max((a - e).abs().max().item() for a, e in zip(actual, expected))"]),
        'print(f"max abs diff, freezing: {diff:.3g}")',
        f"sys.exit(1 if not diff <= {atol} else 0)", ""])


def _eager_ok(program: Program) -> bool:
    """Whether the candidate's model runs in eager mode (a reduction may have broken a shape)."""
    source = to_source(program).split("model, x =")[0]
    scope: dict = {}
    try:
        exec(compile(source, "<candidate>", "exec"), scope)   # the candidate's own class, defined here
        with torch.no_grad():
            scope["M"]()(torch.randn(*program.input_shape))
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------------------------- reductions
@dataclass(frozen=True)
class Reduction:
    """One change to a program: bypass ``node`` by its ``arg``-th input, or halve ``"channels"``/``"size"``."""

    what: str            # "summand", "node", "output", "tail" (cut after node), "channels", "size"
    node: str = ""
    arg: int = 0

    def label(self) -> str:
        if self.what == "summand":
            return f"drop summand {self.arg} of {self.node}"
        if self.what in ("output", "tail"):
            return f"drop output {self.node}" if self.what == "output" else f"cut after {self.node}"
        return f"bypass {self.node}" if self.what == "node" else f"halve {self.what}"


def _bypasses(program: Program, what: str) -> list[Reduction]:
    """Every reduction of one kind: ``"summand"``, ``"node"`` (first input of the same shape) or ``"output"``."""
    if what == "output":
        return [Reduction("output", name) for name in program.outputs] if len(program.outputs) > 1 else []
    found = []
    for n in program.nodes:
        refs = _refs(n.args)
        if what == "summand" and n.target == "add":
            found += [Reduction("summand", n.name, k) for k in (0, 1)
                      if program.shapes.get(refs[1 - k] if len(refs) == 2 else None) == program.shapes.get(n.name)]
        elif what == "node" and n.target != "add" and refs:
            if program.shapes.get(refs[0], program.input_shape if refs[0] == "x" else None) == program.shapes.get(n.name):
                found.append(Reduction("node", n.name))
    return found


def _apply(program: Program, reductions: Sequence[Reduction]) -> Program:
    """``program`` with ``reductions`` applied in order and dead nodes removed."""
    nodes = {n.name: n for n in program.nodes}
    order = [n.name for n in program.nodes]
    alias: dict[str, str] = {}
    resolve = lambda r: resolve(alias[r]) if r in alias else r
    shape_in, channels = tuple(program.input_shape), lambda c: c
    cut, dropped_outputs = None, set()
    for red in reductions:
        if red.what in ("node", "summand"):
            node = nodes.get(red.node)
            if node is None or red.node in alias:
                continue
            refs = _refs(node.args)
            keep = refs[0] if red.what == "node" else refs[1 - red.arg]
            if resolve(keep) == red.node:
                continue
            alias[red.node] = keep
        elif red.what == "tail":
            cut = red.node
        elif red.what == "output":
            dropped_outputs.add(red.node)
        elif red.what == "channels":
            channels = (lambda old: (lambda c: old(math.ceil(c / 2))))(channels)
            shape_in = (shape_in[0], math.ceil(shape_in[1] / 2), *shape_in[2:])
        elif red.what == "size":
            shape_in = (*shape_in[:2], *(max(1, s // 2) for s in shape_in[2:]))
    kept = [replace(nodes[name], args=_map_refs(nodes[name].args, resolve),
                    target=_scale_channels(nodes[name].target, channels))
            for name in order if name not in alias]
    outputs = tuple(dict.fromkeys(resolve(o) for o in program.outputs if o not in dropped_outputs))
    if cut is not None:   # cut the tail: return what the nodes after it read from the nodes before it
        head = order[:order.index(cut) + 1]
        needed = {resolve(r) for name in order[len(head):] if name not in alias for r in _refs(nodes[name].args)}
        outputs = tuple(n for n in head if n not in alias and (n in needed or n in outputs))
        kept = [k for k in kept if k.name in head]
    outputs = outputs or tuple(k.name for k in kept[-1:])
    live, alive = set(outputs), []
    for node in reversed(kept):          # dead-code elimination, from the output back
        if node.name in live:
            live.update(_refs(node.args))
            alive.append(node)
    return Program(tuple(reversed(alive)), shape_in, outputs, program.shapes)


def _scale_channels(target: str, channels: Callable[[int], int]) -> str:
    head, _, rest = target.partition("(")
    if head not in ("nn.Conv2d", "nn.BatchNorm2d", "nn.Linear"):
        return target
    parts = rest.rstrip(")").split(", ")
    count = 1 if head == "nn.BatchNorm2d" else 2
    parts[:count] = [str(channels(int(p))) for p in parts[:count]]
    return f"{head}(" + ", ".join(parts) + ")"


def _has_conv_add(program: Program) -> bool:
    """The rewrite under suspicion needs ``conv(x) + other``: a candidate without one is not worth a compile."""
    convs = set()
    for n in program.nodes:   # a batch norm after a convolution is folded into it by freezing
        if n.kind == "module" and (n.target.startswith("nn.Conv2d")
                                   or n.target.startswith("nn.BatchNorm2d") and set(_refs(n.args)) & convs):
            convs.add(n.name)
    return any(n.target == "add" and set(_refs(n.args)) & convs for n in program.nodes)


# ------------------------------------------------------------------------------------ the check
def _check_in_fresh_process(source: str, timeout: float) -> tuple[str, str]:
    """``(outcome, last line)`` of a candidate script run under ``timeout``: ``fails`` (exit 1), ``passes``,
    ``timed out`` or ``error`` (a broken candidate, not the bug)."""
    with tempfile.TemporaryDirectory(prefix="graphbook-minimize-") as folder:
        script = Path(folder) / "candidate.py"
        script.write_text(source)
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMED_OUT, f"no answer within {timeout:g} s"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    last = lines[-1] if lines else ""
    return {1: FAILS, 0: PASSES}.get(proc.returncode, ERROR), last


class _OutOfTime(Exception):
    """The minimization's total budget is spent: keep the smallest failing program found so far."""


# >>> taught on appendix/anatomy_of_a_miscompile.ipynb: edit it there, then run scripts/export_taught_code.py
def ddmin(items: list, fails: Callable[[list], bool]) -> list:
    """Zeller's delta debugging: a 1-minimal sublist of ``items`` for which ``fails`` still holds.
    ``fails(items)`` must hold on entry. Tries each of ``n`` chunks, then each complement,
    and splits finer when neither fails; every sublist is tested at most once."""
    seen: dict[tuple, bool] = {}

    def test(subset: list) -> bool:
        key = tuple(subset)
        if key not in seen:
            seen[key] = fails(subset)
        return seen[key]

    n = 2
    while len(items) >= 2:
        size = math.ceil(len(items) / n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for chunk in chunks:
            if test(chunk):
                items, n = chunk, 2
                break
        else:
            for k in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != k for x in c]
                if test(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(2 * n, len(items))
    return items
# <<< end of the code taught on appendix/anatomy_of_a_miscompile.ipynb


@dataclass
class Step:
    """One candidate of a minimization: what was removed, what the check said, how long it took."""

    step: int
    phase: str
    removed: str
    program: str
    outcome: str
    still_failing: bool
    seconds: float
    detail: str = ""


Check = Callable[[str, float], tuple]


def minimize(program: Program, *, check: Check = _check_in_fresh_process, candidate_timeout: float = 120,
             budget: float = 1800, log: Callable[[Step], None] = lambda step: None,
             phases: Sequence[str] = ("tail", "output", "summand", "node", "channels", "size"),
             ) -> tuple[Program, list[Step]]:
    """``(smallest failing program, steps)``: cut the tail, ddmin over outputs, summands and nodes, halve channels
    and sizes, while the check fails; stops with what it has after ``budget`` seconds."""
    start, steps, best = time.perf_counter(), [], [program]

    def run(candidate: Program, phase: str, removed: str) -> bool:
        if steps and time.perf_counter() - start > budget:
            raise _OutOfTime
        t0 = time.perf_counter()
        if not _has_conv_add(candidate) or not _eager_ok(candidate):
            outcome, detail = SKIPPED, "no conv + add left" if not _has_conv_add(candidate) else "eager forward fails"
        else:
            outcome, detail = check(to_source(candidate), candidate_timeout)
        step = Step(len(steps), phase, removed, candidate.describe(), outcome, outcome == FAILS,
                    round(time.perf_counter() - t0, 1), detail)
        steps.append(step)
        log(step)
        if step.still_failing and _size(candidate) < _size(best[0]):
            best[0] = candidate   # kept even if the budget runs out in the middle of a phase
        return step.still_failing

    if not run(program, "start", "nothing"):
        raise ValueError(f"the captured program does not fail the check ({steps[0].outcome}: {steps[0].detail})")
    try:
        for phase in phases:
            if phase == "tail":
                program = _cut_tail(program, run)
            elif phase in ("summand", "node", "output"):
                units = _bypasses(program, phase)

                def fails(kept, _units=units, _phase=phase, _program=program):
                    dropped = [u for u in _units if u not in kept]
                    text = ", ".join(u.label() for u in dropped[:3])
                    more = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
                    return run(_apply(_program, dropped), _phase, f"{len(dropped)} of {len(_units)}: {text}{more}")

                if units and not fails([]):     # all of them at once first: the cheapest success
                    ddmin(units, fails)
            else:
                while True:
                    candidate = _apply(program, [Reduction(phase)])
                    if candidate == program or not run(candidate, phase, f"halve {phase}"):   # nothing left to halve
                        break
                    program = candidate
            program = best[0]
    except _OutOfTime:
        pass
    return best[0], steps


def _cut_tail(program: Program, run) -> Program:
    """Bisect for the earliest node after which the rest of the program can be cut while it still fails."""
    names = [n.name for n in program.nodes]
    low, high = 0, len(names) - 1        # cutting after the last node changes nothing
    while high - low > 1:
        middle = (low + high) // 2
        if run(_apply(program, [Reduction("tail", names[middle])]), "tail", f"cut after {names[middle]}"):
            high = middle
        else:
            low = middle
    return _apply(program, [Reduction("tail", names[high])])


def _size(program: Program) -> tuple:
    widths = sum(int(d) for n in program.nodes if n.kind == "module" for d in re.findall(r"\d+", n.target))
    return (len(program.nodes), math.prod(program.input_shape), widths)   # fewer nodes, then a smaller input, then narrower
