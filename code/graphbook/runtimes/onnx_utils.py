"""Export to ONNX, ONNX Runtime sessions and providers, and what each optimization level does to the graph."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import Counter
from pathlib import Path
from typing import Mapping

import onnx
import pandas as pd
import torch
from torch.export import Dim
from torch.onnx import _constants

from graphbook import checks
from graphbook.config import BATCH_SIZES, THREADS
from graphbook.runtimes.ort_sessions import (  # noqa: F401 - the sessions' own module; callers may read them here
    CPU_PROVIDER, CUDA_PROVIDER, LEVEL_NAMES, NCHWC_TRANSFORMER, TENSORRT_PROVIDER, OnnxModelError, available_providers,
    check_model_file, make_session, optimization_level, ort_version, resolve_providers, run_session, session_options)

# The exporter's default opset in torch 2.13, and the lowest one its operator library (torchlib,
# written for opset 18) can target without a down-conversion that has produced invalid models.
DEFAULT_OPSET = 20
MIN_OPSET = 18
# ONNX writes the standard domain as the empty string; the book prints its name.
STANDARD_DOMAIN = "ai.onnx"
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


class OnnxExportError(ValueError):
    """A model or an argument that the book's export helper refuses, with the reason (Chapter 4)."""


# ---- Export
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
    """Export ``model`` with torch's default (dynamo) exporter and return the written path (Chapter 4)."""
    if not isinstance(model, torch.nn.Module):
        raise OnnxExportError(f"export_onnx needs a torch.nn.Module, got {type(model).__name__}")
    training = [name for name, module in model.named_modules() if module.training]  # "" is the root
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
    """Export with a symbolic batch dimension ``batch`` in ``min_batch..max_batch`` (Chapter 7)."""
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


# ---- Graph inspection
def op_counts(model_or_path) -> Counter:
    """Nodes of the model's (or the file's) main graph counted by ``(domain, op_type)`` (Chapter 4)."""
    model = (onnx.load(str(check_model_file(model_or_path)), load_external_data=False)
             if isinstance(model_or_path, (str, Path)) else model_or_path)
    return Counter((node.domain or STANDARD_DOMAIN, node.op_type) for node in model.graph.node)


def op_counts_table(counts: Mapping[str, Counter]):
    """A DataFrame: one row per ``domain::op_type``, one integer column per named graph, plus a total row."""
    keys = sorted({key for counter in counts.values() for key in counter})
    table = pd.DataFrame({name: [int(counter.get(key, 0)) for key in keys] for name, counter in counts.items()},
                         index=[f"{domain}::{op}" for domain, op in keys])
    table.loc["total nodes"] = table.sum()
    table.index.name = "operator"
    return table.astype(int)


def _ops(counter: Counter, op_type: str, domain: str | None = None) -> int:
    return sum(n for (d, op), n in counter.items() if op == op_type and (domain is None or d == domain))


def name_fusions(before: Counter, after: Counter) -> list[str]:
    """Name the rewrites that turned graph ``before`` into graph ``after``, from their counts (Chapter 4)."""
    notes = []
    nchwc = "com.microsoft.nchwc"

    def gained(op_type, domain=None):
        return _ops(after, op_type, domain) - _ops(before, op_type, domain)

    bn_gone = -gained("BatchNormalization")
    if bn_gone > 0:
        notes.append(f"Conv+BatchNormalization folding: {bn_gone} BatchNormalization nodes removed")
    fused_conv, fused_gemm = gained("FusedConv", "com.microsoft"), gained("FusedGemm", "com.microsoft")
    if fused_conv > 0:
        notes.append(f"Conv+activation fusion: {fused_conv} com.microsoft::FusedConv nodes")
    if fused_gemm > 0:
        notes.append(f"Gemm+activation fusion: {fused_gemm} com.microsoft::FusedGemm nodes")
    nchwc_conv = gained("Conv", nchwc)
    if nchwc_conv > 0:
        reorders = sum(n for (d, op), n in after.items() if d == nchwc and op.startswith("Reorder")) - sum(
            n for (d, op), n in before.items() if d == nchwc and op.startswith("Reorder"))
        notes.append(f"NCHWc blocked layout: {nchwc_conv} {nchwc}::Conv nodes, {reorders} layout reorders")
    if fused_conv > 0 or fused_gemm > 0 or nchwc_conv > 0:
        absorbed = [f"{-gained(op)} {op}" for op in ("Relu", "Sigmoid", "Clip", "Add") if gained(op) < 0]
        if absorbed:
            notes.append("absorbed into the fused operators: " + ", ".join(absorbed))
    if not notes and before != after:
        notes.append("other rewrites: removed " + ", ".join(f"{n} {d}::{op}" for (d, op), n in
                                                             sorted((Counter(before) - Counter(after)).items())))
    return notes


def check_batches(model, path: str | Path, input_chw, batch_sizes=BATCH_SIZES, *, threads: int = THREADS,
                  seed: int = 0) -> list[dict]:
    """Serve every batch size from ONE session on ``path`` and compare each with eager ``model`` (Chapter 7)."""
    session = make_session(path, threads=threads)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in batch_sizes:
        x = torch.randn(b, *input_chw, generator=gen)
        try:
            out = run_session(session, x)
        except Exception as error:  # ORT's pybind errors: a dimension the model fixed
            rows.append({"batch_size": int(b), "error": str(error).splitlines()[0][:300]})
            continue
        with torch.no_grad():
            reference = model(x)
        rows.append({"batch_size": int(b), "output_shape": tuple(out.shape), **checks.compare_to_reference(out, reference)})
    return rows
