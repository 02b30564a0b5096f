"""The BlurBall variants the book measures, in one registry (Chapters 3-7)."""
from __future__ import annotations

import contextlib
import copy
import io
import re
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnxruntime as ort
import torch
import torch._inductor.config as inductor_config
from torch.utils import _pytree as pytree

from graphbook.compilers.inductor_tools import freezing
from graphbook.config import THREADS
from graphbook.runtimes import onnx_utils, openvino_runtime
from graphbook.int8 import quantization
from graphbook.method import folding
from graphbook.runtimes.onnx_utils import LEVEL_NAMES

Runner = Callable[[torch.Tensor], torch.Tensor]
#: A model's input: one tensor, or a tuple of tensors passed as positional arguments.
Example = torch.Tensor | tuple

#: The reference every variant is compared with.
REFERENCE = "eager_fp32"


class VariantUnavailable(RuntimeError):
    """A variant cannot be built here (a missing package, no calibration frames); the message says why (Chapter 5)."""


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def arguments(example: Example) -> tuple:
    """The positional arguments of a model call: a tuple as it is, one tensor as a 1-tuple."""
    return example if isinstance(example, tuple) else (example,)


def as_float(output):
    """Every tensor of an output (a tensor, tuple, dict or ``ModelOutput``) as contiguous float32."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.float().contiguous(), output)


def _outputs(values: Sequence) -> torch.Tensor | list[torch.Tensor]:
    """A runtime's outputs as float tensors: the tensor when there is one, else the list in pytree order."""
    tensors = [torch.from_numpy(np.asarray(v)).float() for v in values]
    return tensors[0] if len(tensors) == 1 else tensors


@dataclass
class BuildContext:
    """What the builders share (Chapter 5): a folder for exported files, threads, calibration frames."""

    workdir: str | Path | None = None
    threads: int = THREADS
    calibration: Sequence[torch.Tensor] | None = None
    cache: dict = field(default_factory=dict)
    _scratch: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def folder(self) -> Path:
        if self.workdir is None and self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="graphbook-onnx-")
        path = Path(self.workdir if self.workdir is not None else self._scratch.name)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass(frozen=True)
class Variant:
    """One BlurBall variant (Chapter 5). ``builder(model, example, context) -> runner``."""

    name: str
    label: str
    description: str
    precision: str                  # "fp32", "bf16", "int8"
    family: str                     # "eager", "compile", "onnxruntime", "openvino"
    expected_to_match_eager: bool
    builder: Callable[[torch.nn.Module, torch.Tensor, BuildContext], Runner] = field(repr=False)
    needs_calibration: bool = False


@dataclass
class Built:
    """A built variant (Chapter 5): ``run(x)`` returns the model's output with every tensor as float32."""

    variant: Variant
    run: Runner
    compile_s: float
    note: str = ""
    artifact: Path | None = None


# ------------------------------------------------------------------------------------------ builders
def _eager(model, example, context, *, channels_last=False, bf16=False, folded=False) -> Runner:
    module = model
    if folded:
        module, _ = folding.fold_all_conv_bn(model, arguments(example))
    if channels_last:
        module = copy.deepcopy(module).to(memory_format=torch.channels_last)

    def run(x):
        args = arguments(x)
        if channels_last:  # only 4-D inputs have a channels-last layout
            args = tuple(a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args)
        with torch.no_grad(), _autocast(bf16):
            return as_float(module(*args))
    return run


def own_code(model):
    """A copy of ``model`` whose ``forward`` has its own code object (Chapter 3)."""
    model = copy.deepcopy(model)
    forward = type(model).forward
    code = forward.__code__.replace()  # equal code, a distinct object: its own Dynamo cache
    model.forward = types.MethodType(types.FunctionType(code, forward.__globals__, forward.__name__,
                                                        forward.__defaults__, forward.__closure__), model)
    return model


def _compiled(model, example, context, *, freeze=False, bf16=False, mode=None, options=None, **ablation) -> Runner:
    compiled = torch.compile(own_code(model), mode=mode)
    # max-autotune's tuning is part of its compile: no cache of an earlier build may answer for it
    cold = (inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False) if mode == "max-autotune"
            else contextlib.nullcontext())

    def run(x):
        with freezing(freeze, **ablation), _autocast(bf16), cold, inductor_config.patch(options or {}):
            return as_float(compiled(*arguments(x)))
    return run


def onnx_available() -> tuple[bool, str]:
    """Whether the ONNX variants can be built here, and if not why (Chapter 4)."""
    try:
        import onnxscript  # noqa: F401
    except ImportError as error:
        return False, f"ONNX variants need onnxscript ({error})"
    return True, ""


def onnx_file(model, example, context: BuildContext, export: str) -> Path:
    """The exported model for ``export`` in ``raw``, ``optimized``, ``int8`` (cached in the context; Chapter 4)."""
    available, why = onnx_available()
    if not available:
        raise VariantUnavailable(why)
    key = (id(model), tuple(tuple(a.shape) for a in arguments(example)), export)
    if key in context.cache:
        return context.cache[key]
    folder = context.folder()
    if export in ("raw", "optimized"):  # the raw file: the exporter's optimizer off, constants folded
        path = onnx_utils.export_onnx(model.eval(), arguments(example), folder / f"model_{export}.onnx", external_data=False,
                                      optimize=export == "optimized", fold_constants=export == "raw")
    elif export == "int8":
        if not context.calibration:
            raise VariantUnavailable("the INT8 Q/DQ variant needs calibration frames (BuildContext.calibration)")
        if len(arguments(example)) != 1:
            raise VariantUnavailable("INT8 calibration here feeds a model of one input")
        path = quantization.quantize_qdq(onnx_file(model, example, context, "optimized"),
                                       folder / "model_int8_qdq.onnx", list(context.calibration))
    else:
        raise ValueError(f"unknown export {export!r}; choose raw, optimized or int8")
    context.cache[key] = path
    return path


def _ort(model, example, context, *, export: str, level: str, disabled: Sequence[str] = ()) -> Runner:
    path = onnx_file(model, example, context, export)
    session = onnx_utils.make_session(path, level=level, threads=context.threads, disabled_optimizers=disabled)

    names = [i.name for i in session.get_inputs()]

    def run(x):
        return _outputs(session.run(None, {n: a.detach().numpy() for n, a in zip(names, arguments(x))}))
    run.session, run.onnx_path = session, path
    return run


def _openvino(model, example, context, *, export: str, precision: str) -> Runner:
    """OpenVINO's CPU plugin on the book's ONNX file: the same file ONNX Runtime runs, another compiler."""
    available, why = openvino_runtime.available()
    if not available:
        raise VariantUnavailable(why)
    if precision == "bf16":  # without native BF16 the hint would time an emulation, not the CPU's bf16
        native, why = openvino_runtime.bf16_native()
        if not native:
            raise VariantUnavailable(why)
    return openvino_runtime.runner(onnx_file(model, example, context, export), precision=precision,
                                   threads=context.threads)


def _registry() -> dict[str, Variant]:
    entries = [
        Variant("eager_fp32", "eager FP32", "eager, FP32, NCHW (the reference)", "fp32", "eager", True,
                _eager),
        Variant("eager_fp32_channels_last", "channels-last", "eager, FP32, channels-last (NHWC) model and input",
                "fp32", "eager", True, lambda m, x, c: _eager(m, x, c, channels_last=True)),
        Variant("eager_fp32_channels_last_folded", "channels-last, BN folded",
                "eager, FP32, channels-last, every foldable BatchNorm folded into its convolution", "fp32", "eager",
                True, lambda m, x, c: _eager(m, x, c, channels_last=True, folded=True)),
        Variant("eager_bf16_autocast", "bf16 autocast", "eager, bfloat16 autocast", "bf16", "eager", False,
                lambda m, x, c: _eager(m, x, c, bf16=True)),
        Variant("compile_default", "compile", "torch.compile, default mode, freezing off (the default)",
                "fp32", "compile", True, _compiled),
        Variant("compile_no_layout_optimization", "compile, no layout optimization",
                "torch.compile, default mode, freezing off, Inductor's layout optimization off", "fp32", "compile",
                True, lambda m, x, c: _compiled(m, x, c, options={"layout_optimization": False})),
        # Expected to match: freezing folds constants, an exact rewrite (torch 2.13 miscompiled BlurBall with it;
        # 2.14.1 does not, the appendix's version history).
        Variant("compile_freezing", "compile + freezing",
                "torch.compile, default mode, Inductor freezing on (BN folded, oneDNN convs)", "fp32", "compile",
                True, lambda m, x, c: _compiled(m, x, c, freeze=True)),
        Variant("compile_bf16", "compile bf16", "torch.compile, freezing off, under bfloat16 autocast", "bf16",
                "compile", False, lambda m, x, c: _compiled(m, x, c, bf16=True)),
        Variant("compile_freezing_bf16", "compile + freezing bf16",
                "torch.compile with Inductor freezing, under bfloat16 autocast", "bf16", "compile", False,
                lambda m, x, c: _compiled(m, x, c, freeze=True, bf16=True)),
        # What freezing unlocks on a CPU with longer tuning: prepacked weights, AMX, C++ GEMM templates.
        Variant("compile_freezing_max_autotune", "max-autotune + freezing",
                "torch.compile mode max-autotune with Inductor freezing", "fp32", "compile", True,
                lambda m, x, c: _compiled(m, x, c, freeze=True, mode="max-autotune")),
        Variant("compile_freezing_max_autotune_bf16", "max-autotune + freezing bf16",
                "torch.compile mode max-autotune with Inductor freezing, under bfloat16 autocast", "bf16", "compile",
                False, lambda m, x, c: _compiled(m, x, c, freeze=True, bf16=True, mode="max-autotune")),
    ]
    # Fusion taken out of freezing in two steps, in both precisions (Chapter 5): first the scheduler's (no two kernels
    # merged), then also the residual add that oneDNN folds into the convolution in place.
    for name, label, ablation in (
            ("no_fusion", "max_fusion_size=1", {"fusion": False}),
            ("out_of_place_conv_add_no_fusion", "conv + add out of place, max_fusion_size=1",
             {"fusion": False, "inplace_conv_add": False})):
        for bf16 in (False, True):
            entries.append(Variant(f"compile_freezing_{name}" + "_bf16" * bf16,
                                   f"compile + freezing, {label}" + " bf16" * bf16,
                                   f"torch.compile with Inductor freezing and {label}" + ", bfloat16 autocast" * bf16,
                                   "bf16" if bf16 else "fp32", "compile", not bf16,
                                   lambda m, x, c, ablation=ablation, bf16=bf16: _compiled(
                                       m, x, c, freeze=True, bf16=bf16, **ablation)))
    for level in LEVEL_NAMES:
        entries.append(Variant(f"ort_{level}", f"ONNX Runtime {level}",
                               f"ONNX Runtime, raw export, level {level}", "fp32", "onnxruntime", True,
                               lambda m, x, c, level=level: _ort(m, x, c, export="raw", level=level)))
    entries += [
        # The layout level's blocked-layout rewrite taken out of level all: what NCHWc is worth on its own.
        Variant("ort_all_without_nchwc", "ONNX Runtime all without NCHWc",
                "ONNX Runtime, raw export, level all with the NCHWc rewrite disabled", "fp32", "onnxruntime", True,
                lambda m, x, c: _ort(m, x, c, export="raw", level="all", disabled=(onnx_utils.NCHWC_TRANSFORMER,))),
        Variant("ort_exporter_optimized_all", "ONNX Runtime exporter-optimized",
                "ONNX Runtime, exporter-optimized export, level all", "fp32", "onnxruntime", True,
                lambda m, x, c: _ort(m, x, c, export="optimized", level="all")),
        Variant("ort_int8_qdq_all", "ONNX Runtime INT8 (Q/DQ)",
                "ONNX Runtime, INT8 Q/DQ (static, min-max), level all", "int8", "onnxruntime", False,
                lambda m, x, c: _ort(m, x, c, export="int8", level="all"), needs_calibration=True),
        # OpenVINO from the same files: FP32 and BF16 from the raw export (OpenVINO folds BN itself), INT8
        # from the Q/DQ model ONNX Runtime runs, so the two runtimes are compared on one quantized graph.
        Variant("openvino_fp32", "OpenVINO FP32", "OpenVINO CPU plugin, raw export, f32 inference precision",
                "fp32", "openvino", True, lambda m, x, c: _openvino(m, x, c, export="raw", precision="f32")),
        Variant("openvino_bf16", "OpenVINO bf16",
                "OpenVINO CPU plugin, raw export, bf16 inference precision (native BF16 only)", "bf16", "openvino",
                False, lambda m, x, c: _openvino(m, x, c, export="raw", precision="bf16")),
        Variant("openvino_int8", "OpenVINO INT8 (Q/DQ)", "OpenVINO CPU plugin, the INT8 Q/DQ model (static, min-max)",
                "int8", "openvino", False, lambda m, x, c: _openvino(m, x, c, export="int8", precision="f32"),
                needs_calibration=True),
    ]
    return {v.name: v for v in entries}


#: name -> :class:`Variant`, in the order the book reports them (eager FP32 first).
REGISTRY: dict[str, Variant] = _registry()

#: Variants of recordings made under torch 2.13, retired with its freezing miscompile: the switches that made
#: freezing correct there, and max-autotune built on them. Read back as written, never measured again.
RETIRED = {"compile_freezing_no_pattern_matcher": "freezing, pattern_matcher=False",
           "compile_freezing_out_of_place_conv_add": "freezing, conv + add out of place",
           "compile_freezing_out_of_place_conv_add_bf16": "freezing, conv + add out of place, bf16",
           "compile_max_autotune": "max-autotune + freezing, max_fusion_size=1",
           "compile_max_autotune_bf16": "max-autotune + freezing, max_fusion_size=1, bf16",
           "compile_max_autotune_fused": "max-autotune + freezing, conv + add out of place"}

#: Each lower precision's FP32 twin: the same runtime and settings in FP32. A lower precision passes only when
#: it keeps the decoded ball *and* its twin gives eager's output: rounding can hide a miscompile it inherits
#: (compile + freezing bf16 keeps the ball, yet its logits are as far off as the FP32 freezing miscompile's).
FP32_TWINS = {**{name: name.removesuffix("_bf16") for name in REGISTRY if name.startswith("compile_") and
                 name.endswith("_bf16")}, "eager_bf16_autocast": "eager_fp32", "compile_bf16": "compile_default",
              "ort_int8_qdq_all": "ort_exporter_optimized_all", "openvino_bf16": "openvino_fp32",
              "openvino_int8": "openvino_fp32"}


def get(name: str) -> Variant:
    """The registered variant ``name``; ValueError listing the names otherwise (Chapter 5)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(REGISTRY)}") from None


def names(*, families: Sequence[str] | None = None, precisions: Sequence[str] | None = None) -> list[str]:
    """Registered names, optionally only some families / precisions, in registry order (Chapter 5)."""
    return [n for n, v in REGISTRY.items() if (families is None or v.family in families)
            and (precisions is None or v.precision in precisions)]


def by_label(label: str) -> Variant:
    """The variant whose human label is ``label`` (Chapter 6's table is keyed by labels)."""
    for variant in REGISTRY.values():
        if variant.label == label:
            return variant
    raise ValueError(f"no variant labelled {label!r}")


_NOTES = {"compile_default": "freezing off", "compile_freezing": "freezing on", "compile_bf16": "freezing off",
          "compile_freezing_bf16": "freezing on"}


_AUTOTUNED = re.compile(r"^AUTOTUNE (\w+)\(([^)]*)\)\n(?:\S.*\n)*?\s+(\S+) [0-9.]+ ms", re.M)


def _autotuned(log: str) -> str:
    """What max-autotune tuned, from the report it writes to stderr: the products and which kind won (Chapter 5)."""
    tuned = _AUTOTUNED.findall(log)
    if not tuned:
        return ""
    ops = sorted({op for op, _, _ in tuned})
    templates = sum(winner.startswith("cpp_") for _, _, winner in tuned)
    return (f"max-autotune tuned {len(tuned)} matrix products ({', '.join(ops)}; first {tuned[0][1]}); "
            f"a C++ template won {templates}")


def build(name: str, model: torch.nn.Module, example: torch.Tensor, context: BuildContext | None = None, *,
          warm: bool = True) -> Built:
    """Build variant ``name`` for ``model`` and ``example`` (Chapter 5)."""
    variant = get(name)
    own_context = context is None
    context = context or BuildContext()
    try:
        tuning_log = io.StringIO()
        start = time.perf_counter()
        run = variant.builder(model.eval(), example, context)
        if warm:
            try:
                with contextlib.redirect_stderr(tuning_log):   # max-autotune reports each tuned product there
                    run(example)
            finally:
                sys.stderr.write(tuning_log.getvalue())
        seconds = time.perf_counter() - start
        note = _NOTES.get(name, "") or _autotuned(tuning_log.getvalue())
        if variant.family in ("onnxruntime", "openvino"):
            note = (f"ORT {ort.__version__}" if variant.family == "onnxruntime"
                    else f"OpenVINO {openvino_runtime.version()}")
        artifact = None if own_context else getattr(run, "onnx_path", None)  # the file the runtime loaded
    finally:
        if own_context:  # a session keeps its model in memory: the files can go
            context.close()
    return Built(variant, run, seconds, note, artifact)


def runners(model: torch.nn.Module, example: torch.Tensor, selected: Sequence[str] | None = None,
            context: BuildContext | None = None, *, key: str = "label", skip_unavailable: bool = True,
            warm: bool = False) -> dict[str, Runner]:
    """Runners for several variants, keyed by label (default) or name, reference first (Chapter 6)."""
    selected = list(selected) if selected is not None else list(REGISTRY)
    if REFERENCE not in selected:
        selected.insert(0, REFERENCE)
    out = {}
    for name in selected:
        try:
            built = build(name, model, example, context, warm=warm)
        except VariantUnavailable:
            if not skip_unavailable:
                raise
            continue
        out[getattr(built.variant, key)] = built.run
    return out
