"""Export to ONNX, ONNX Runtime sessions and providers, and what each optimization level does to the graph.

Introduced in Chapter 4. The chapter's questions are answered from the graph file itself: what the
exporter wrote, and what each ONNX Runtime optimization level turned it into (the optimized graph is
saved and its operators counted by domain and type). Whether the result still matches eager is
:func:`graphbook.runtimes.correctness.compare_to_reference`; the operator profile is
:func:`graphbook.teach.profiling.profile_operators`; Q/DQ quantization is :mod:`graphbook.runtimes.quantization`; the GPU
runtimes are detected by :func:`graphbook.lab.gpu_runtimes.detect_gpu_runtimes`.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import torch
from torch.export import Dim
from torch.onnx import _constants

from graphbook.config import THREADS

# The exporter's default opset in torch 2.13, and the lowest one its operator library (torchlib,
# written for opset 18) can target without a down-conversion that has produced invalid models.
DEFAULT_OPSET = 20
MIN_OPSET = 18

# Book names of ONNX Runtime's levels, in increasing order, with the enum member each stands for.
LEVEL_ENUM_NAMES = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
LEVEL_NAMES = tuple(LEVEL_ENUM_NAMES)
#: ONNX Runtime's name for the rewrite of convolutions to its blocked NCHWc layout (part of the layout level).
NCHWC_TRANSFORMER = "NchwcTransformer"

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"

# ONNX writes the standard domain as the empty string; the book prints its name.
STANDARD_DOMAIN = "ai.onnx"
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


class OnnxExportError(ValueError):
    """A model or an argument that the book's export helper refuses, with the reason (Chapter 4)."""


class OnnxModelError(ValueError):
    """A file that ONNX Runtime (or the onnx package) cannot load as a model (Chapter 4)."""


# --------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------

def _modules_in_training_mode(model) -> list[str]:
    """Names of the submodules of ``model`` that are in training mode (Chapter 4). ``""`` is the root."""
    return [name for name, module in model.named_modules() if module.training]


def _quiet_exporter():
    """Silence the exporter's progress lines and its optional-package warnings (torchvision ops)."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    for name in ("torch.onnx", "torch.onnx._internal.exporter._registration", "onnxscript"):
        logger = logging.getLogger(name)
        previous = logger.level
        logger.setLevel(logging.ERROR)
        stack.callback(logger.setLevel, previous)
    return stack


def export_onnx(model, example_inputs, path: str | Path, *, opset: int = DEFAULT_OPSET,
                optimize: bool = True, fold_constants: bool = False,
                external_data: bool = True, dynamic_shapes=None) -> Path:
    """Export ``model`` with torch's default (dynamo) exporter and return the written path (Chapter 4).

    ``optimize=True`` runs the exporter's own optimizer (constant folding plus rewrite rules that,
    among other things, fold BatchNorm into the preceding Conv). ``optimize=False`` keeps the graph
    as translated; ``fold_constants=True`` then applies constant folding only, so that ONNX
    Runtime's own Conv+BN fusion has constant inputs to work with (without it, a bias-free Conv is
    given a computed zero bias that ONNX Runtime does not fold). ``external_data=True`` (the
    exporter's default) stores the weights in ``<path>.data`` beside the graph: ship both files.

    ``dynamic_shapes`` is passed to ``torch.onnx.export`` (``torch.export`` style, e.g.
    ``({0: Dim("batch", min=1, max=3)},)``); :func:`export_dynamic_batch` is the book's use of it.

    Raises :class:`OnnxExportError` for a model in training mode (the exporter would only warn and
    write inference-mode BatchNorm, so the file would not match the model it came from), for an
    opset below :data:`MIN_OPSET` or above the exporter's maximum, and for a path not ending in
    ``.onnx``.
    """
    if not isinstance(model, torch.nn.Module):
        raise OnnxExportError(f"export_onnx needs a torch.nn.Module, got {type(model).__name__}")
    training = _modules_in_training_mode(model)
    if training:
        shown = ", ".join(repr(n or "<root>") for n in training[:3])
        raise OnnxExportError(
            f"the model is in training mode ({len(training)} modules, e.g. {shown}); call model.eval() "
            "before exporting: the exporter writes inference-mode BatchNorm anyway, so a training-mode "
            "export silently differs from the model you exported")

    max_opset = int(getattr(_constants, "ONNX_MAX_OPSET", DEFAULT_OPSET))
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= max_opset:
        raise OnnxExportError(
            f"opset {opset!r} is not supported: use {MIN_OPSET}..{max_opset} (default {DEFAULT_OPSET}); "
            f"below {MIN_OPSET} the exporter must down-convert its opset-{MIN_OPSET} operators, which can "
            "produce a model ONNX Runtime refuses to load")
    if fold_constants and optimize:
        raise OnnxExportError("fold_constants=True only makes sense with optimize=False "
                              "(the exporter's optimizer already folds constants)")
    path = Path(path)
    if path.suffix != ".onnx":
        raise OnnxExportError(f"the output path must end in .onnx, got {str(path)!r}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_file = path.with_name(path.name + ".data")
    if data_file.exists():  # a stale weights file from an earlier export would be silently reused
        data_file.unlink()
    with _quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(model, tuple(example_inputs), None, opset_version=opset,
                                    optimize=optimize, external_data=external_data, verbose=False,
                                    dynamic_shapes=dynamic_shapes)
        if fold_constants:
            from onnxscript import optimizer

            optimizer.fold_constants(program.model)
        program.save(path, external_data=external_data)
    return path


def export_dynamic_batch(model, example_input, path: str | Path, *, min_batch: int = 1, max_batch: int = 3,
                         **export_kwargs) -> Path:
    """Export with a symbolic batch dimension ``batch`` in ``min_batch..max_batch`` (Chapter 7).

    One session then serves every batch size in the range (a server's dynamic batcher needs that).
    ``example_input`` should have a batch of at least 2: ``torch.export`` specialises a size-1
    dimension to the constant 1 (it cannot tell a batch of 1 from a broadcast dimension), so a
    batch-1 example can fail or silently give a static model. The written file is checked: if its
    first input's dimension 0 is not symbolic, :class:`OnnxExportError` says so instead of leaving
    a model that refuses every other batch size.
    """
    if not 1 <= min_batch <= max_batch:
        raise OnnxExportError(f"need 1 <= min_batch <= max_batch, got {min_batch}..{max_batch}")
    dim = Dim("batch", min=min_batch, max=max_batch)
    path = export_onnx(model, (example_input,), path, dynamic_shapes=({0: dim},), **export_kwargs)
    batch = input_batch_dim(path)
    if isinstance(batch, int):
        raise OnnxExportError(f"the exporter wrote a static batch of {batch} to {str(path)!r}; export from an "
                              "example with a batch of 2 or more")
    return path


def input_batch_dim(path: str | Path) -> int | str:
    """Dimension 0 of a model's first input: an int when static, its symbol's name when dynamic (Chapter 7)."""
    model = onnx.load(str(check_model_file(path)), load_external_data=False)
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    return dim.dim_param if dim.dim_param else int(dim.dim_value)


def onnx_files(path: str | Path) -> list[Path]:
    """The files that make up an exported model: the graph and, if present, its external weights (Chapter 4)."""
    path = Path(path)
    data_file = path.with_name(path.name + ".data")
    return [p for p in (path, data_file) if p.exists()]


# --------------------------------------------------------------------------------------------------
# Loading, sessions, providers
# --------------------------------------------------------------------------------------------------

def optimization_level(name):
    """ONNX Runtime's ``GraphOptimizationLevel`` for a book level name (Chapter 4).

    Takes the book's names only (``disabled``, ``basic``, ``extended``, ``layout``, ``all``: the enum member
    each stands for is :data:`LEVEL_ENUM_NAMES`). Raises ValueError naming the choices for anything else,
    and for ``layout`` on an ONNX Runtime too old to have that level.
    """
    member_name = LEVEL_ENUM_NAMES.get(name) if isinstance(name, str) else None
    if member_name is None:
        raise ValueError(f"unknown optimization level {name!r}; choose one of {list(LEVEL_NAMES)}")
    member = getattr(ort.GraphOptimizationLevel, member_name, None)
    if member is None:
        raise ValueError(f"this ONNX Runtime ({ort.__version__}) has no {member_name} level")
    return member


def check_model_file(path: str | Path) -> Path:
    """Return ``path`` if it exists and parses as an ONNX model, else raise a clear error (Chapter 4).

    FileNotFoundError for a missing file, :class:`OnnxModelError` for one that is not an ONNX model
    (truncated, corrupt, or another format). External weights are not loaded, so this is cheap.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model {str(path)!r} does not exist (export it first with export_onnx)")
    try:
        onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises DecodeError, and others for other damage
        raise OnnxModelError(f"{str(path)!r} is not a readable ONNX model ({type(error).__name__}: {error}); "
                             "re-export it") from error
    return path


def ort_version() -> str:
    """The installed ONNX Runtime version (Chapter 4)."""
    return str(ort.__version__)


def available_providers() -> list[str]:
    """The execution providers this ONNX Runtime install offers, in its priority order (Chapter 4)."""
    return list(ort.get_available_providers())


@dataclass(frozen=True)
class ProviderChoice:
    """The providers a session will use and those that were asked for but are absent (Chapter 4)."""

    providers: tuple[str, ...]
    missing: tuple[str, ...] = ()

    @property
    def fell_back(self) -> bool:
        """True when some requested provider is absent from this install."""
        return bool(self.missing)

    def note(self) -> str:
        """One sentence saying what runs where, for printing in a chapter."""
        runs = ", ".join(self.providers)
        if not self.missing:
            return f"running on {runs}"
        return (f"{', '.join(self.missing)} not available in this ONNX Runtime install; "
                f"running on {runs} instead")


def resolve_providers(requested: Sequence[str] | str | None = None,
                      available: Sequence[str] | None = None) -> ProviderChoice:
    """Keep the requested providers this install has, in order, and always end with the CPU (Chapter 4).

    Asking for ``["TensorrtExecutionProvider", "CUDAExecutionProvider"]`` on a CPU-only install
    gives ``providers == ("CPUExecutionProvider",)`` with both named in ``missing``, instead of
    ONNX Runtime's own behaviour (a warning and a silent fallback). ``available`` defaults to
    :func:`available_providers`; pass it to reason about another machine.
    """
    if requested is None:
        requested = [CPU_PROVIDER]
    elif isinstance(requested, str):
        requested = [requested]
    requested = list(requested)
    if not requested or not all(isinstance(p, str) and p for p in requested):
        raise ValueError(f"providers must be a non-empty list of provider names, got {requested!r}")
    have = list(available) if available is not None else available_providers()
    chosen = [p for p in dict.fromkeys(requested) if p in have]
    missing = [p for p in dict.fromkeys(requested) if p not in have]
    if CPU_PROVIDER not in chosen:
        chosen.append(CPU_PROVIDER)
    return ProviderChoice(tuple(chosen), tuple(missing))


def session_options(*, level="all", threads: int = THREADS, optimized_model_path: str | Path | None = None,
                    profile_prefix: str | Path | None = None):
    """``SessionOptions`` with the level, an explicit intra-op thread count and quiet logging (Chapter 4).

    ``threads`` is explicit because ONNX Runtime's default (0) means "one per physical core", which
    differs between machines. ``optimized_model_path`` makes ONNX Runtime save the graph it runs;
    ``profile_prefix`` turns on its profiler (Chrome-trace JSON written by ``end_profiling()``).
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization_level(level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: the NCHWc "hardware specific" notice is expected
    if optimized_model_path is not None:
        Path(optimized_model_path).parent.mkdir(parents=True, exist_ok=True)
        options.optimized_model_filepath = str(optimized_model_path)
    if profile_prefix is not None:
        Path(profile_prefix).parent.mkdir(parents=True, exist_ok=True)
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return options


def make_session(path: str | Path, *, level="all", threads: int = THREADS,
                 providers: Sequence[str] | str | None = None,
                 optimized_model_path: str | Path | None = None,
                 profile_prefix: str | Path | None = None,
                 provider_options: Sequence[Mapping] | None = None,
                 disabled_optimizers: Sequence[str] = ()):
    """An ``InferenceSession`` for the model at ``path`` (Chapter 4).

    ``disabled_optimizers`` names graph transformers the level would run that this session skips (for
    example ``NCHWC_TRANSFORMER``, the rewrite to blocked-layout convolutions), which separates one rewrite
    from the others of its level.
    Providers go through :func:`resolve_providers` (absent GPU providers fall back to the CPU; the
    session's ``get_providers()`` says what it really uses). ``provider_options``, if given, are
    matched to the requested providers by position and dropped for absent ones. A missing file
    raises FileNotFoundError; a file ONNX Runtime cannot load raises :class:`OnnxModelError`.
    """
    path = check_model_file(path)
    requested = [CPU_PROVIDER] if providers is None else ([providers] if isinstance(providers, str)
                                                         else list(providers))
    choice = resolve_providers(requested)
    options_by_name = {}
    if provider_options is not None:
        if len(provider_options) != len(requested):
            raise ValueError("provider_options needs one mapping per requested provider "
                             f"({len(requested)}), got {len(provider_options)}")
        options_by_name = dict(zip(requested, provider_options))
    chosen_options = [dict(options_by_name.get(p, {})) for p in choice.providers]
    options = session_options(level=level, threads=threads, optimized_model_path=optimized_model_path,
                              profile_prefix=profile_prefix)
    try:
        return ort.InferenceSession(str(path), options, providers=list(choice.providers),
                                    provider_options=chosen_options,
                                    **({"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}))
    except Exception as error:  # ORT raises its own pybind exception types (InvalidProtobuf, Fail...)
        raise OnnxModelError(f"ONNX Runtime could not load {str(path)!r}: {error}") from error


def run_session(session, inputs) -> np.ndarray:
    """Run a one-input, one-output session and return the output (Chapter 4).

    ``inputs`` is a NumPy array or torch tensor for the single input, or a dict name -> array.
    """
    if not isinstance(inputs, Mapping):
        names = [i.name for i in session.get_inputs()]
        if len(names) != 1:
            raise ValueError(f"the model has inputs {names}; pass a dict name -> array")
        inputs = {names[0]: inputs}
    feed = {name: (value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value))
            for name, value in inputs.items()}
    return session.run(None, feed)[0]


# --------------------------------------------------------------------------------------------------
# Graph inspection
# --------------------------------------------------------------------------------------------------

def _graph(model_or_path):
    if isinstance(model_or_path, (str, Path)):
        path = check_model_file(model_or_path)
        return onnx.load(str(path), load_external_data=False).graph
    graph = getattr(model_or_path, "graph", None)
    if graph is None or not hasattr(graph, "node"):
        raise TypeError(f"expected a path or an onnx.ModelProto, got {type(model_or_path).__name__}")
    return graph


def op_counts(model_or_path) -> Counter:
    """Nodes of the model's main graph counted by ``(domain, op_type)`` (Chapter 4).

    The standard domain (written as ``""`` in the file) is reported as ``"ai.onnx"``, so ONNX
    Runtime's own operators (``com.microsoft``, ``com.microsoft.nchwc``) stand out.
    """
    return Counter((node.domain or STANDARD_DOMAIN, node.op_type) for node in _graph(model_or_path).node)


def op_counts_table(counts: Mapping[str, Counter]):
    """A DataFrame: one row per ``domain::op_type``, one integer column per named graph, plus a total row.

    Introduced in Chapter 4 to put the graphs of several optimization levels side by side.
    """
    keys = sorted({key for counter in counts.values() for key in counter})
    table = pd.DataFrame({name: [int(counter.get(key, 0)) for key in keys] for name, counter in counts.items()},
                         index=[f"{domain}::{op}" for domain, op in keys])
    table.loc["total nodes"] = table.sum()
    table.index.name = "operator"
    return table.astype(int)


def _graph_difference(before: Counter, after: Counter) -> dict[str, Counter]:
    """Operators that disappeared and appeared between two graphs' counts (Chapter 4)."""
    keys = set(before) | set(after)
    removed = Counter({k: before.get(k, 0) - after.get(k, 0) for k in keys if before.get(k, 0) > after.get(k, 0)})
    added = Counter({k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) > before.get(k, 0)})
    return {"removed": removed, "added": added}


def _ops(counter: Counter, op_type: str, domain: str | None = None) -> int:
    return sum(n for (d, op), n in counter.items() if op == op_type and (domain is None or d == domain))


def name_fusions(before: Counter, after: Counter) -> list[str]:
    """Name the rewrites that turned graph ``before`` into graph ``after``, from their counts (Chapter 4).

    Recognises the CPU rewrites the chapter discusses: BatchNormalization folded into Conv,
    Conv + activation fused into ``com.microsoft::FusedConv``, the NCHWc blocked layout
    (``com.microsoft.nchwc`` operators with reorders), and element-wise operators absorbed by a
    fused convolution. Returns an empty list when nothing changed.
    """
    notes = []
    nchwc = "com.microsoft.nchwc"
    bn_gone = _ops(before, "BatchNormalization") - _ops(after, "BatchNormalization")
    if bn_gone > 0:
        notes.append(f"Conv+BatchNormalization folding: {bn_gone} BatchNormalization nodes removed")
    fused_conv = _ops(after, "FusedConv", "com.microsoft") - _ops(before, "FusedConv", "com.microsoft")
    if fused_conv > 0:
        notes.append(f"Conv+activation fusion: {fused_conv} com.microsoft::FusedConv nodes")
    fused_gemm = _ops(after, "FusedGemm", "com.microsoft") - _ops(before, "FusedGemm", "com.microsoft")
    if fused_gemm > 0:
        notes.append(f"Gemm+activation fusion: {fused_gemm} com.microsoft::FusedGemm nodes")
    nchwc_conv = _ops(after, "Conv", nchwc) - _ops(before, "Conv", nchwc)
    if nchwc_conv > 0:
        reorders = sum(n for (d, op), n in after.items() if d == nchwc and op.startswith("Reorder")) - sum(
            n for (d, op), n in before.items() if d == nchwc and op.startswith("Reorder"))
        notes.append(f"NCHWc blocked layout: {nchwc_conv} {nchwc}::Conv nodes, {reorders} layout reorders")
    if fused_conv > 0 or fused_gemm > 0 or nchwc_conv > 0:
        absorbed = [(op, _ops(before, op) - _ops(after, op)) for op in ("Relu", "Sigmoid", "Clip", "Add")]
        absorbed = [f"{n} {op}" for op, n in absorbed if n > 0]
        if absorbed:
            notes.append("absorbed into the fused operators: " + ", ".join(absorbed))
    diff = _graph_difference(before, after)
    if not notes and (diff["removed"] or diff["added"]):
        notes.append("other rewrites: removed " + ", ".join(f"{n} {d}::{op}" for (d, op), n in
                                                             sorted(diff["removed"].items())))
    return notes
