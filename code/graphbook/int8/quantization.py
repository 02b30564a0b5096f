"""Static INT8 quantization of an ONNX file with ONNX Runtime: Q/DQ nodes, calibration, settings (Chapter 4)."""
from __future__ import annotations

import ast
import contextlib
import io
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnxruntime import quantization as quant
from onnxruntime.quantization import CalibrationDataReader, QuantType
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
from onnxruntime.quantization.shape_inference import quant_pre_process

from graphbook.measure.environment import cpu_features
from graphbook.runtimes.onnx_utils import QDQ_OPS, _ops, check_model_file, op_counts

INT16_MAX = 32767
UINT8_MAX = 255


def calibration_reader(input_name: str, frames: Iterable):
    """An ONNX Runtime ``CalibrationDataReader`` that feeds ``frames`` one at a time (Chapter 4)."""
    batches = [f.detach().cpu().numpy() if hasattr(f, "detach") else np.asarray(f, dtype=np.float32)
               for f in frames]
    if not batches:
        raise ValueError("calibration needs at least one input frame")

    class FrameReader(CalibrationDataReader):
        def __init__(self):
            self._items = iter({input_name: b.astype(np.float32)} for b in batches)

        def get_next(self):
            return next(self._items, None)

    return FrameReader()


def worst_u8s8_pair_sum(reduce_range: bool) -> int:
    """The largest |a1*w1 + a2*w2| of two uint8 activations and two int8 weights (Chapter 4)."""
    return 2 * UINT8_MAX * (64 if reduce_range else 127)


@dataclass(frozen=True)
class Int8Settings:
    """The static-quantization settings chosen for a CPU, and why (Chapter 4)."""

    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    reduce_range: bool = False
    per_channel: bool = True
    reason: str = ""

    def quantize_static_kwargs(self) -> dict:
        """Keyword arguments for ``onnxruntime.quantization.quantize_static``."""
        return {"activation_type": getattr(QuantType, self.activation_type),
                "weight_type": getattr(QuantType, self.weight_type),
                "reduce_range": self.reduce_range, "per_channel": self.per_channel}


def int8_settings_for(features: Mapping | None = None, *, per_channel: bool = True) -> Int8Settings:
    """INT8 settings that do not saturate on the CPU described by ``features`` (Chapter 4)."""
    if features is None:
        features = cpu_features()
    arch, vnni = features.get("arch", "other"), features.get("vnni")
    full, reduced = worst_u8s8_pair_sum(False), worst_u8s8_pair_sum(True)
    if arch == "x86" and vnni:
        which = "AVX-512 VNNI" if features.get("avx512_vnni") else "AVX-VNNI"
        return Int8Settings(reduce_range=False, per_channel=per_channel, reason=(
            f"This CPU has {which}, whose instruction adds u8 x s8 products straight into 32-bit sums, "
            "so full 8-bit weights cannot overflow and reduce_range stays off."))
    if arch == "x86" and vnni is False:
        return Int8Settings(reduce_range=True, per_channel=per_channel, reason=(
            f"This CPU has no VNNI: ONNX Runtime's INT8 kernels add each pair of u8 x s8 products into a "
            f"16-bit intermediate that saturates at {INT16_MAX}; with 8-bit weights a pair can reach "
            f"{full}, so the weights are quantized to 7 bits (reduce_range=True, at most {reduced})."))
    if arch == "arm":
        return Int8Settings(reduce_range=False, per_channel=per_channel, reason=(
            "On ARM, ONNX Runtime's INT8 kernels widen every product before adding (NEON multiply-long, "
            "or SDOT/UDOT into 32-bit lanes), so the 16-bit overflow of x86 without VNNI does not arise "
            "and reduce_range stays off."))
    return Int8Settings(reduce_range=True, per_channel=per_channel, reason=(
        "This CPU's instruction set could not be read, so the settings that hold on every x86 CPU are used: "
        f"7-bit weights (reduce_range=True), whose u8 x s8 pairs stay below {INT16_MAX} (at most {reduced})."))


def quantize_qdq(fp32_path: str | Path, out_path: str | Path, frames: Iterable, *,
                 per_channel: bool = True, settings: Int8Settings | None = None,
                 features: Mapping | None = None) -> Path:
    """Static INT8 quantization to the explicit Q/DQ format, calibrated on ``frames`` (Chapter 4)."""
    settings = settings or int8_settings_for(features, per_channel=per_channel)
    config = Int8Config("qdq", per_channel=settings.per_channel, reduce_range=settings.reduce_range)
    return quantize_config(fp32_path, out_path, config, list(frames))["path"]


def qdq_counts(model_or_path) -> dict[str, int]:
    """Number of QuantizeLinear and DequantizeLinear nodes in a model (Chapter 4)."""
    counts = op_counts(model_or_path)
    return {op: _ops(counts, op) for op in QDQ_OPS}


#: The layer groups that can be kept in FP32 (see :func:`node_group`).
GROUPS = ("stem", "head", "se")
#: Module names of BlurBall's stem (top-level convolutions, their BatchNorms, the stem's ReLU) and of its head.
STEM_MODULES = ("conv1", "bn1", "conv2", "bn2", "relu")
HEAD_MODULE = "final_layers"
#: Quantized bins of ONNX Runtime's entropy calibrator (its default, kept here); see :class:`Int8Config`.
ENTROPY_QUANTIZED_BINS = 128
#: Histogram bins of the design's real entropy calibration: 4x the quantized bins gives the search
#: 193 candidate ranges; 2048 (TensorRT's choice) makes ONNX Runtime's Python search take minutes.
ENTROPY_BINS = 512
BASELINE_NAME = "baseline"


class Int8MatrixError(ValueError):
    """A configuration or an argument the INT8 matrix refuses, with the reason (Chapter 4)."""


@dataclass(frozen=True)
class Int8Config:
    """One static-quantization choice (Chapter 4)."""

    name: str
    per_channel: bool = True
    calibration: str = "MinMax"  # or "Entropy", "Percentile": onnxruntime's CalibrationMethod
    pre_process: bool = False
    exclude: tuple[str, ...] = ()
    reduce_range: bool = False
    role: str = "baseline"
    histogram_bins: int | None = None  # Entropy or Percentile only; the search needs more than its quantized bins

    @property
    def excluded(self) -> str:
        """The excluded groups as one cell, e.g. ``"stem+head+se"`` ("" when everything is quantized)."""
        return "+".join(g for g in GROUPS if g in self.exclude)


def design(reduce_range: bool, *, smoke: bool = False) -> list[Int8Config]:
    """The configurations of the matrix, baseline first (Chapter 4)."""
    base = Int8Config(BASELINE_NAME, reduce_range=reduce_range, role="baseline")
    if smoke:
        return [base, replace(base, name="smoke-combination", per_channel=False, calibration="Entropy",
                              histogram_bins=2 * ENTROPY_QUANTIZED_BINS, pre_process=True, exclude=GROUPS,
                              role="combination")]
    return [
        base,
        replace(base, name="per-tensor", per_channel=False, role="vary per_channel"),
        replace(base, name="entropy", calibration="Entropy", role="vary calibration"),
        replace(base, name=f"entropy-{ENTROPY_BINS}-bins", calibration="Entropy", histogram_bins=ENTROPY_BINS,
                role="vary calibration"),
        replace(base, name="percentile", calibration="Percentile", role="vary calibration"),
        replace(base, name="pre-processed", pre_process=True, role="vary pre_process"),
        replace(base, name="no-stem", exclude=("stem",), role="vary exclude"),
        replace(base, name="no-head", exclude=("head",), role="vary exclude"),
        replace(base, name="no-se", exclude=("se",), role="vary exclude"),
        replace(base, name="no-stem-head-se", exclude=GROUPS, role="vary exclude"),
        replace(base, name=f"reduce-range-{str(not reduce_range).lower()}", reduce_range=not reduce_range,
                role="vary reduce_range"),
        replace(base, name="careful", calibration="Percentile", pre_process=True, exclude=GROUPS,
                role="combination"),
        replace(base, name="per-tensor-excluded", per_channel=False, exclude=GROUPS, role="combination"),
    ]


def node_scopes(node) -> list[str]:
    """The module path the exporter recorded for ``node`` (``pkg.torch.onnx.name_scopes``), or []."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                value = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return []
            return [str(v) for v in value] if isinstance(value, (list, tuple)) else []
    return []


def node_group(scopes: Sequence[str]) -> str | None:
    """``"stem"``, ``"head"``, ``"se"`` or None for a node's module path (Chapter 4)."""
    modules = [s for s in scopes if s]
    if not modules:
        return None
    if any("se" in m.split(".") for m in modules):
        return "se"
    top = modules[0].split(".")[0]
    if top == HEAD_MODULE:
        return "head"
    if top in STEM_MODULES:
        return "stem"
    return None


def module_of(scopes: Sequence[str]) -> str:
    """The innermost module path in a ``name_scopes`` list (its last entry names the operation; Chapter 4)."""
    modules = [s for s in scopes if s]
    return modules[-2] if len(modules) >= 2 else (modules[0] if modules else "")


def _nodes_in_groups(model_or_path, groups: Iterable[str]) -> list[str]:
    """Names of the nodes in the given layer groups, for ``quantize_static(nodes_to_exclude=...)`` (Chapter 4)."""
    model = onnx.load(str(model_or_path), load_external_data=False) if isinstance(model_or_path, (str, Path)) \
        else model_or_path
    classes = {node.name: node_group(node_scopes(node)) for node in model.graph.node}
    empty = [g for g in groups if g not in classes.values()]
    if empty:
        raise Int8MatrixError(f"no node of the model belongs to {empty}: was it exported by torch.onnx with "
                              "module names (pkg.torch.onnx.name_scopes metadata)?")
    return [name for name, group in classes.items() if group in groups]


@contextlib.contextmanager
def quiet_onnxruntime():
    """Silence the quantizer: calibration progress on stdout and the pre-processing hint on the root logger."""
    root = logging.getLogger()
    previous = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(previous)


def quantize_config(fp32_path: str | Path, out_path: str | Path, config: Int8Config, frames: Sequence) -> dict:
    """Build the Q/DQ model of one configuration, calibrated on ``frames`` (Chapter 4)."""
    fp32_path = check_model_file(fp32_path)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    source = fp32_path
    with quiet_onnxruntime():
        if config.pre_process:
            source = out_path.with_name(out_path.stem + ".pre.onnx")
            quant_pre_process(str(fp32_path), str(source))
        excluded = _nodes_in_groups(source, config.exclude) if config.exclude else []
        input_name = onnx.load(str(source), load_external_data=False).graph.input[0].name
        reader, cache = calibration_reader(input_name, frames), None
        if config.histogram_bins is not None:  # calibrate here, hand the ranges over as a calibration cache
            cache = out_path.with_name(out_path.stem + ".calibration.json")
            cache.unlink(missing_ok=True)  # a stale cache would be loaded instead of calibrating
            op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))  # quantize_static's default op types
            calibrator = create_calibrator(Path(source), op_types,
                                           augmented_model_path=str(out_path.parent / f"{cache.stem}.augmented.onnx"),
                                           calibrate_method=getattr(quant.CalibrationMethod, config.calibration),
                                           extra_options={"num_bins": config.histogram_bins,
                                                          "num_quantized_bins": ENTROPY_QUANTIZED_BINS})
            calibrator.collect_data(reader)
            save_tensors_data(calibrator.compute_data(), cache)
            reader = None
        settings = Int8Settings(reduce_range=config.reduce_range, per_channel=config.per_channel)
        quant.quantize_static(str(source), str(out_path), reader, quant_format=quant.QuantFormat.QDQ,
                              nodes_to_exclude=excluded or None, **settings.quantize_static_kwargs(),
                              calibrate_method=getattr(quant.CalibrationMethod, config.calibration),
                              calibration_cache_path=str(cache) if cache else None)
    return {"path": out_path, "quantize_s": time.perf_counter() - start, "excluded_nodes": len(excluded),
            "quantize_nodes": qdq_counts(out_path)["QuantizeLinear"]}
