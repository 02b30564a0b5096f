"""Static INT8 quantization of an ONNX file with ONNX Runtime: Q/DQ nodes, calibration, settings (Chapter 4).

Introduced in Chapter 4: :func:`int8_settings_for` picks the activation and weight types this CPU can run
without overflow, :func:`calibration_reader` feeds calibration frames, :func:`quantize_qdq` writes the Q/DQ
model and :func:`qdq_counts` counts its nodes. :mod:`graphbook.int8_matrix` varies these choices.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from .onnx_utils import QDQ_OPS, _ops, check_model_file, op_counts

INT16_MAX = 32767
UINT8_MAX = 255


def calibration_reader(input_name: str, frames: Iterable):
    """An ONNX Runtime ``CalibrationDataReader`` that feeds ``frames`` one at a time (Chapter 4).

    Each frame is one model input (e.g. a ``(1, 9, 288, 512)`` array or tensor).
    """
    from onnxruntime.quantization import CalibrationDataReader

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
    """The largest |a1*w1 + a2*w2| of two uint8 activations and two int8 weights (Chapter 4).

    x86 CPUs without VNNI multiply u8 x s8 with ``vpmaddubsw``, which adds each pair of products
    into a *16-bit* lane and saturates at 32767. Full int8 weights (|w| <= 127) can reach
    2 x 255 x 127 = 64770 and saturate; ``reduce_range`` weights (|w| <= 64) reach at most
    2 x 255 x 64 = 32640, which fits. A number fixed by the arithmetic, the same on every CPU.
    """
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
        from onnxruntime.quantization import QuantType

        return {"activation_type": getattr(QuantType, self.activation_type),
                "weight_type": getattr(QuantType, self.weight_type),
                "reduce_range": self.reduce_range, "per_channel": self.per_channel}


def int8_settings_for(features: Mapping | None = None, *, per_channel: bool = True) -> Int8Settings:
    """INT8 settings that do not saturate on the CPU described by ``features`` (Chapter 4).

    ``features`` is a :func:`graphbook.record.environment.cpu_features` dict (default: this CPU, which the
    variable ``GRAPHBOOK_CPU_FEATURES`` can override to ask what another CPU would get). uint8
    activations and int8 weights throughout; ``reduce_range`` (7-bit weights) is switched on wherever
    the u8 x s8 products may go through a 16-bit intermediate -- x86 without VNNI, or a CPU whose
    features cannot be read -- and the returned ``reason`` says which case applied, in one sentence.
    ONNX Runtime picks its kernel from the real CPU and offers no way to cap it, so these settings
    are decided from the features, not from the kernel it will run.
    """
    if features is None:
        from .record.environment import cpu_features

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
    """Static INT8 quantization to the explicit Q/DQ format, calibrated on ``frames`` (Chapter 4).

    Activations are uint8 and weights int8 (per output channel by default), with min-max ranges
    from the calibration frames. The result is an ordinary ONNX file in which every quantized tensor
    passes through QuantizeLinear/DequantizeLinear: the explicit style that replaced TensorRT's
    calibrators. Use a model whose BatchNorm is already folded (an ``optimize=True`` export).
    ``settings`` default to :func:`int8_settings_for` ``(features)``: 7-bit weights on x86 without
    VNNI, where 8-bit ones saturate (max abs error 0.274 instead of 0.035 on the test block, issue 11).
    """
    from onnxruntime import quantization as quant

    fp32_path = check_model_file(fp32_path)
    out_path = Path(out_path)
    if out_path.suffix != ".onnx":
        raise ValueError(f"the output path must end in .onnx, got {str(out_path)!r}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    import onnx

    if settings is None:
        settings = int8_settings_for(features, per_channel=per_channel)
    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    reader = calibration_reader(input_name, frames)
    root_logger = logging.getLogger()
    previous = root_logger.level
    root_logger.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint as a warning
    try:
        quant.quantize_static(str(fp32_path), str(out_path), reader, quant_format=quant.QuantFormat.QDQ,
                              calibrate_method=quant.CalibrationMethod.MinMax, **settings.quantize_static_kwargs())
    finally:
        root_logger.setLevel(previous)
    return out_path


def qdq_counts(model_or_path) -> dict[str, int]:
    """Number of QuantizeLinear and DequantizeLinear nodes in a model (Chapter 4)."""
    counts = op_counts(model_or_path)
    return {op: _ops(counts, op) for op in QDQ_OPS}
