"""Looking inside torch.compile: generated code, kernel counts, graph breaks, ablations (Chapter 3)."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence
from unittest import mock

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._inductor.fx_passes import mkldnn_fusion
from torch._inductor.graph import GraphLowering


@contextlib.contextmanager
def freezing(enabled: bool = True, *, fusion: bool = True, inplace_conv_add: bool = True):
    """Inductor freezing on (``enabled=False``: explicitly off) inside the block (Chapter 3), and Chapter 5's ablations:
    ``fusion=False`` merges no two kernels, ``inplace_conv_add=False`` leaves the residual add a kernel of its own."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch(freezing=bool(enabled), **({} if fusion else {"max_fusion_size": 1})))
        stack.enter_context(torch.no_grad())
        if not inplace_conv_add:
            # a patched predicate is not part of the compile caches' keys: without them off, a cached plain
            # freezing graph would come back
            stack.enter_context(inductor_config.patch(fx_graph_cache=False))
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
            stack.enter_context(mock.patch.object(mkldnn_fusion, "_can_be_inplace", lambda other: False))
        yield


# A kernel definition in Inductor's wrapper code: ``name = async_compile.<backend>(...``.
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(cpp_pybinding|cpp|triton|cuda|halide)\(", re.M)
# Calls to library kernels from the wrapper's ``call`` function.
_EXTERN_CALL = re.compile(r"\b(extern_kernels\.\w+|torch\.ops\.\w+\.\w+)(?:\.\w+)?\(")

# The ablation of Chapter 3 (the PyTorch 2 paper's Table 4), as ``torch._inductor.config`` patches for the compile.
# ``max_fusion_size=1`` is the paper's "w/o fusion": the scheduler merges no two nodes, but Inductor still inlines
# pointwise bodies into their consumers while lowering (no switch for that), so element-wise chains stay one loop.
ABLATION_CONFIGS: dict[str, dict] = {
    "all optimizations": {"freezing": True},
    "without fusion": {"freezing": True, "max_fusion_size": 1},
    "without freezing": {"freezing": False},
    "without fusion and freezing": {"freezing": False, "max_fusion_size": 1},
}

# The rows that really switch fusion off on the C++ backend, kept apart so recorded runs of the four above read the
# same: ``fallback_by_default`` (behind Inductor's "lite" mode) lowers every ATen operator to a call of its kernel, no
# generated code: the paper's "without fusion and inlining". The backend row runs the same decomposed graph op by op.
UNFUSED_ABLATION_CONFIGS: dict[str, dict] = {
    "without fusion and inlining": {"freezing": False, "fallback_by_default": True},
}
# Rows that remove one cause the CPU speed-up could come from, for the attribution: ``layout_optimization``
# (Inductor converting convolutions and their neighbours to channels-last) off, freezing off as in the default.
CAUSE_ABLATION_CONFIGS: dict[str, dict] = {
    "without layout optimization": {"freezing": False, "layout_optimization": False},
}
UNFUSED_ABLATION_BACKENDS: dict[str, str] = {
    "decomposed op by op (aot_eager)": "aot_eager_decomp_partition",  # no comma: --variants splits on commas
}


@dataclass
class GeneratedCode:
    """What one compiled call produced: its output, the wrapper source(s) and what they call (Chapter 3)."""

    output: object
    sources: list[str]
    kernels: list[str] = field(default_factory=list)
    extern_calls: list[str] = field(default_factory=list)
    compiled: Callable | None = None  # the compiled callable, to time it without compiling again

    @property
    def kernel_count(self) -> int:
        """Kernels defined (each compiled once)."""
        return len(self.kernels)

    @property
    def launches(self) -> dict:
        """Kernel launches per call, generated and library (see :func:`_launch_counts`)."""
        return _launch_counts(self.sources)

    @property
    def code(self) -> str:
        return "\n".join(self.sources)


def kernel_definitions(sources: str | Sequence[str]) -> list[str]:
    """Names of the kernels defined in Inductor's generated code, in order (Chapter 3)."""
    sources = [sources] if isinstance(sources, str) else sources
    return [m.group(1) for src in sources for m in _KERNEL_DEF.finditer(src)]


def count_kernels(sources: str | Sequence[str]) -> int:
    """Number of kernels Inductor generated (definitions in the code, not the metrics counter) (Chapter 3)."""
    return len(kernel_definitions(sources))


def extern_calls(sources: str | Sequence[str]) -> list[str]:
    """Library kernels the wrapper calls (``extern_kernels.convolution``...), one per call site (Chapter 3)."""
    sources = [sources] if isinstance(sources, str) else sources
    return [m.group(1) for src in sources for m in _EXTERN_CALL.finditer(_call_body(src))]


def _call_body(source: str) -> str:
    """The text of the wrapper's ``call`` method (where kernels are launched)."""
    start = source.find("def call(self, args)")
    if start < 0:
        start = source.find("def call(args)")
    if start < 0:
        return source
    end = source.find("\nrunner = ", start)
    if end < 0:
        end = source.find("\ndef get_args", start)
    return source[start:end if end > 0 else len(source)]


def call_sequence(sources: str | Sequence[str]) -> list[str]:
    """The launches in the wrapper's ``call`` in order, shortened to ``name(...)`` (Chapter 3)."""
    sources = [sources] if isinstance(sources, str) else sources
    names = set(kernel_definitions(sources))
    launches = []
    for src in sources:
        for line in _call_body(src).splitlines():
            stripped = line.strip()
            match = re.match(r"(?:\w+ = )?([\w.]+)\(", stripped)
            if not match:
                continue
            callee = match.group(1)
            callee = re.sub(r"\.(default|Tensor)$", "", callee)
            if callee in names or _EXTERN_CALL.search(stripped):
                launches.append(f"{callee}(...)")
    return launches


def _launch_counts(sources: str | Sequence[str]) -> dict:
    """Launches per forward call: ``{"generated": n, "library": m}`` (Chapter 3)."""
    sequence = call_sequence(sources)
    names = set(kernel_definitions(sources))
    generated = sum(1 for launch in sequence if launch[:-len("(...)")] in names)
    return {"generated": generated, "library": len(sequence) - generated}


def kernel_source(sources: str | Sequence[str], name: str) -> str:
    """The C++ (or Triton) source of one generated kernel, for display (Chapter 3)."""
    sources = [sources] if isinstance(sources, str) else sources
    for src in sources:
        match = re.search(rf"^{re.escape(name)} = async_compile\.\w+\((.*?)^'''\)", src, re.M | re.S)
        if match:
            body = match.group(1)
            start = body.find("'''")
            return body[start + 3:].strip("\n") if start >= 0 else body
    raise KeyError(f"no kernel named {name!r} in the generated code; kernels: {kernel_definitions(sources)}")


def compile_and_get_code(fn: Callable, *args, options: Mapping | None = None, reset: bool = True,
                         **compile_kwargs) -> GeneratedCode:
    """Compile ``fn`` with Inductor, run it once on ``args`` and return the generated code (Chapter 3)."""
    options = dict(options or {})
    if reset:
        torch._dynamo.reset()
    compiled = torch.compile(fn, **compile_kwargs)
    # The options patch the config around the first call, where compilation happens: in torch 2.13,
    # torch.compile(options={"freezing": True}) compiled without freezing (Chapter 3).
    freeze = options.pop("freezing", inductor_config.freezing)
    # The wrapper code is caught as run_and_get_code catches it, without its Dynamo reset: with reset=False, code
    # compiled earlier (another configuration kept for alternated timing, code/bench_ablation.py) stays compiled.
    sources: list[str] = []

    def save_output_code(code: str) -> None:
        if code not in sources:
            sources.append(code)

    with mock.patch.object(GraphLowering, "save_output_code", save_output_code), \
            freezing(freeze), inductor_config.patch(options):
        output = compiled(*args)
    return GeneratedCode(output, sources, kernel_definitions(sources), extern_calls(sources), compiled)


@dataclass
class ExplainSummary:
    """TorchDynamo's view of a function: graphs, breaks and why (Chapter 3)."""

    graph_count: int
    graph_break_count: int
    break_reasons: list[str]
    ops_per_graph: list[int]
    break_lines: list[int | None] = field(default_factory=list)  # source line of each break


def _short_reason(reason) -> str:
    """The first line of a break reason, plus Dynamo's one-line explanation when it gives one."""
    text = str(getattr(reason, "reason", reason)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    short = lines[0]
    explanation = next((line for line in lines[1:] if line.startswith("Explanation:")), None)
    if explanation:
        short += " -- " + explanation[len("Explanation:"):].strip()
    return short[:200]


def explain(fn: Callable, *args) -> ExplainSummary:
    """Run ``torch._dynamo.explain`` and keep the counts and one short line per break (Chapter 3)."""
    torch._dynamo.reset()
    result = torch._dynamo.explain(fn)(*args)
    return ExplainSummary(
        graph_count=int(result.graph_count),
        graph_break_count=int(result.graph_break_count),
        break_reasons=[_short_reason(r) for r in result.break_reasons],
        ops_per_graph=[len(ops) for ops in result.ops_per_graph],
        break_lines=[int(stack[-1].lineno) if (stack := getattr(r, "user_stack", None)) else None
                     for r in result.break_reasons],
    )


def dynamo_graphs(fn: Callable, *args) -> list[torch.fx.GraphModule]:
    """The FX graphs TorchDynamo captures from one call of ``fn`` (Chapter 3)."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record)(*args)
    torch._dynamo.reset()
    return graphs


def ablation_options(name: str) -> dict:
    """The Inductor options of one ablation variant, by name (Chapter 3)."""
    configs = {**ABLATION_CONFIGS, **UNFUSED_ABLATION_CONFIGS, **CAUSE_ABLATION_CONFIGS}
    return dict(configs[name])
