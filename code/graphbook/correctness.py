"""Do optimised variants of the detector still put the ball in the same place? (Chapter 6)

Introduced in Chapter 6. The article warns that fusion reorders additions, so the last digits of the
logits change, and leaves open whether the *ball positions* change. This module answers it with data:
each variant (``torch.compile`` with freezing off and on, bf16 autocast, channels-last, every ONNX
Runtime optimisation level, the Q/DQ INT8 model) runs on held-out synthetic clips whose ball is known
(:mod:`graphbook.synthetic_clips`) and is compared with eager FP32 twice:

- with eager: max abs diff of the logits, and the share of frames whose decoded detection agrees
  (both empty, or both found within ``agree_px`` of each other);
- with the ground truth: detection rate, median position error and median blur-angle error.
"""
from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import blurball, decoding, scoring, synthetic_clips
from .warmup import logits_of

#: Two detections "agree" when their centres are within this many pixels (half a pixel: same blob, same place).
DEFAULT_AGREE_PX = 0.5


_LAST_COMPILED_RUNNER: list = [None]


def _compiled_runner(model, *, freezing: bool) -> Callable:
    import torch._inductor.config as inductor_config

    compiled = torch.compile(copy.deepcopy(model))

    def run(x):
        # Freezing only applies to inference graphs: with autograd on, Inductor silently skips it.
        with inductor_config.patch(freezing=freezing), torch.no_grad():
            # Dynamo caches compiled code on forward's code object, which both copies share, and the
            # freezing setting is not among its guards: without a reset, "compile + freezing" would
            # reuse the graph compiled for "compile" and measure it under the wrong name.
            if _LAST_COMPILED_RUNNER[0] is not run:
                torch._dynamo.reset()
                _LAST_COMPILED_RUNNER[0] = run
            return logits_of(compiled(x))
    return run


def torch_variants(model: torch.nn.Module) -> dict[str, Callable]:
    """Runners ``x -> logits`` for the PyTorch variants, eager FP32 first (Chapter 6).

    The compiled ones compile on their first call (call them once to warm up before timing).
    """
    model = model.eval()
    channels_last = copy.deepcopy(model).to(memory_format=torch.channels_last)

    def eager(x):
        return logits_of(model(x))

    def bf16(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return logits_of(model(x)).float()

    def nhwc(x):
        return logits_of(channels_last(x.contiguous(memory_format=torch.channels_last))).contiguous()

    return {"eager fp32": eager, "compile": _compiled_runner(model, freezing=False),
            "compile + freezing": _compiled_runner(model, freezing=True),
            "bf16 autocast": bf16, "channels-last": nhwc}


def onnx_variants(model: torch.nn.Module, example: torch.Tensor, workdir: str | Path, *,
                  calibration: list[torch.Tensor] | None = None, threads: int = 2,
                  levels=None) -> dict[str, Callable]:
    """Runners for ONNX Runtime at each optimisation level and, with ``calibration``, Q/DQ INT8 (Chapter 6).

    Uses :mod:`graphbook.onnx_utils` (export with the batch dimension dynamic is not needed here:
    every runner is called with the example's batch size).
    """
    from . import onnx_utils

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    fp32 = onnx_utils.export_onnx(model.eval(), (example,), workdir / "detector.onnx", external_data=False)
    runners = {}

    def runner(session):
        return lambda x: torch.from_numpy(np.asarray(onnx_utils.run_session(session, x)))

    for level in levels or onnx_utils.LEVEL_NAMES:
        runners[f"onnxruntime {level}"] = runner(onnx_utils.make_session(fp32, level=level, threads=threads))
    if calibration:
        int8 = onnx_utils.quantize_qdq(fp32, workdir / "detector-int8-qdq.onnx", calibration)
        runners["onnxruntime int8 q/dq"] = runner(onnx_utils.make_session(int8, level="all", threads=threads))
    return runners


def detections_agree(a: list[list], b: list[list], agree_px: float = DEFAULT_AGREE_PX) -> tuple[int, int, float]:
    """Compare two decodings frame by frame (Chapter 6): ``(agreeing frames, frames, largest shift px)``.

    Agreeing: neither found a ball, or both did and the centres are within ``agree_px``. The largest
    shift is over frames where both found one (0 if none).
    """
    agree = total = 0
    shift = 0.0
    for clip_a, clip_b in zip(a, b, strict=True):
        for fa, fb in zip(clip_a, clip_b, strict=True):
            total += 1
            if fa.best is None or fb.best is None:
                agree += fa.best is None and fb.best is None
                continue
            d = math.hypot(fa.best.x - fb.best.x, fa.best.y - fb.best.y)
            shift = max(shift, d)
            agree += d <= agree_px
    return agree, total, shift


def correctness_table(runners: dict[str, Callable], clips: list, *, reference: str = "eager fp32",
                      batch_size: int = 1, threshold: float = 0.5, agree_px: float = DEFAULT_AGREE_PX) -> list[dict]:
    """One row per variant: logits vs ``reference`` and detections vs reference and ground truth (Chapter 6).

    Columns: variant, clips, frames, max_abs_diff, agree_frames, agree_share, max_shift_px,
    detection_rate, median_error_px, median_angle_error_deg, false_positive_rate (plain Python numbers).
    """
    if reference not in runners:
        raise ValueError(f"reference variant {reference!r} is not among {sorted(runners)}")
    if not clips:
        raise ValueError("need at least one held-out clip")
    inputs = [blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(clips[i:i + batch_size]))
              for i in range(0, len(clips), batch_size)]
    outputs = {}
    with torch.no_grad():
        for name, run in runners.items():
            outputs[name] = [run(x).float() for x in inputs]
    decoded = {name: [d for out in outs for d in decoding.decode_batch(out, threshold)] for name, outs in outputs.items()}
    rows = []
    for name in runners:
        diff = max(float((o - r).abs().max()) for o, r in zip(outputs[name], outputs[reference]))
        agree, frames, shift = detections_agree(decoded[name], decoded[reference], agree_px)
        truth = scoring.summarize_matches(scoring.match_detections(decoded[name], clips))
        rows.append({"variant": name, "clips": len(clips), "frames": frames, "max_abs_diff": diff,
                     "agree_frames": int(agree), "agree_share": agree / frames, "max_shift_px": float(shift),
                     "detection_rate": float(truth["detection_rate"]),
                     "median_error_px": float(truth["median_error_px"]),
                     "median_angle_error_deg": float(truth["median_angle_error_deg"]),
                     "false_positive_rate": float(truth["false_positive_rate"])})
    return rows


def all_variants(model: torch.nn.Module, example_clip, *, onnx: bool = True, calibration_clips: list | None = None,
                 threads: int = 2, workdir: str | Path | None = None) -> dict[str, Callable]:
    """Every variant this machine can run, eager FP32 first (Chapter 6).

    ONNX variants need ``onnxruntime`` and ``onnxscript``; without them they are left out (the
    chapter says so from the returned names). ``example_clip`` fixes the exported input shape (batch
    1). The INT8 model is built only when ``calibration_clips`` are given: use clips that are *not*
    the held-out ones, or the calibration ranges would have seen the test.
    """
    runners = torch_variants(model)
    if onnx:
        try:
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError:
            return runners
        example = blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([example_clip]))
        calibration = ([blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([c])) for c in calibration_clips]
                       if calibration_clips else None)
        if workdir is not None:
            runners.update(onnx_variants(model, example, workdir, calibration=calibration, threads=threads))
        else:  # sessions hold their model in memory, so the files can go once they are built
            with tempfile.TemporaryDirectory(prefix="graphbook-onnx-") as scratch:
                runners.update(onnx_variants(model, example, scratch, calibration=calibration, threads=threads))
    return runners
