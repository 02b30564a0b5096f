"""Do optimised variants of the detector still put the ball in the same place? (Chapter 6)"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from graphbook.config import BATCH_SIZES, SAME_OUTPUT_ATOL, THREADS
from graphbook.model import blurball, decoding, scoring, synthetic_clips
from graphbook.record import results
from graphbook.record.results import (
    MAX_ABS_DIFF,
    PEAK_FRAMES,
    RELATIVE_DIFF,
    SAME_OUTPUT,
    SAME_PEAK_FRAMES,
    SAME_PEAKS,
)
from graphbook.runtimes import onnx_utils, variants
from graphbook.runtimes.onnx_utils import LEVEL_NAMES

#: Two detections "agree" when their centres are within this many pixels (half a pixel: same blob, same place).
DEFAULT_AGREE_PX = 0.5
#: A "clear" ball: a decoded blob whose heat sums to at least this (a few pixels over the threshold). The ball check
#: judges the frames where either side decodes one: which of two specks just over 0.5 ranks first is a coin toss
#: any rounding flips, and a blob that crosses the line on one side only is still in the same place.
MIN_BALL_SCORE = 2.0


#: The variants of the correctness table, from :data:`graphbook.runtimes.variants.REGISTRY` (keyed by their labels).
TORCH_VARIANTS = ("eager_fp32", "compile_default", "compile_freezing", "eager_bf16_autocast",
                  "eager_fp32_channels_last")


def _inputs(clips: list, batch_size: int = 1) -> list[torch.Tensor]:
    """The clips as normalised model inputs, ``batch_size`` clips each."""
    return [blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(clips[i:i + batch_size]))
            for i in range(0, len(clips), batch_size)]


def _decoded(outputs, threshold: float) -> list:
    return [d for out in outputs for d in decoding.decode_batch(out, threshold)]


def _detections_agree(a: list[list], b: list[list], agree_px: float = DEFAULT_AGREE_PX,
                      min_score: float = 0.0) -> tuple[int, int, float]:
    """Compare two decodings frame by frame (Chapter 6): ``(agreeing frames, frames, largest shift px)``."""
    agree = total = 0
    shift = 0.0
    for clip_a, clip_b in zip(a, b, strict=True):
        for fa, fb in zip(clip_a, clip_b, strict=True):
            total += 1
            if not any(f.best is not None and f.best.score >= min_score for f in (fa, fb)):
                agree += 1
                continue
            if fa.best is None or fb.best is None:
                continue
            d = math.hypot(fa.best.x - fb.best.x, fa.best.y - fb.best.y)
            shift = max(shift, d)
            agree += d <= agree_px
    return agree, total, shift


def correctness_table(runners: dict[str, Callable], clips: list, *, reference: str = "eager fp32",
                      batch_size: int = 1, threshold: float = 0.5, agree_px: float = DEFAULT_AGREE_PX) -> list[dict]:
    """One row per variant: logits vs ``reference`` and detections vs reference and ground truth (Chapter 6)."""
    if reference not in runners:
        raise ValueError(f"reference variant {reference!r} is not among {sorted(runners)}")
    if not clips:
        raise ValueError("need at least one held-out clip")
    inputs = _inputs(clips, batch_size)
    with torch.no_grad():
        outputs = {name: [run(x).float() for x in inputs] for name, run in runners.items()}
    decoded = {name: _decoded(outs, threshold) for name, outs in outputs.items()}
    rows = []
    for name in runners:
        checks = [compare_to_reference(o, r) for o, r in zip(outputs[name], outputs[reference])]
        diff = max(c[results.MAX_ABS_DIFF] for c in checks)
        try:
            expected = variants.by_label(name).expected_to_match_eager
        except ValueError:
            expected = None
        agree, frames, shift = _detections_agree(decoded[name], decoded[reference], agree_px)
        truth = scoring.summarize_matches(scoring.match_detections(decoded[name], clips))
        rows.append({"variant": name, "clips": len(clips), "frames": frames, results.MAX_ABS_DIFF: diff,
                     results.SAME_OUTPUT: all(c[results.SAME_OUTPUT] for c in checks),
                     results.EXPECTED_TO_MATCH: expected,
                     "agree_frames": int(agree), "agree_share": agree / frames, "max_shift_px": float(shift),
                     **{key: float(truth[key]) for key in ("detection_rate", "median_error_px",
                                                           "median_angle_error_deg", "false_positive_rate")}})
    return rows


def all_variants(model: torch.nn.Module, example_clip, *, onnx: bool = True, calibration_clips: list | None = None,
                 threads: int = THREADS, workdir: str | Path | None = None) -> dict[str, Callable]:
    """Every variant this machine can run, eager FP32 first (Chapter 6)."""
    runners = variants.runners(model.eval(), None, TORCH_VARIANTS)  # keyed by label, eager FP32 first
    if onnx and variants.onnx_available()[0]:
        names = [f"ort_{level}" for level in LEVEL_NAMES] + (["ort_int8_qdq_all"] if calibration_clips else [])
        # without a workdir the files go once the sessions are built (sessions hold their model in memory)
        with tempfile.TemporaryDirectory(prefix="graphbook-onnx-") as scratch:
            context = variants.BuildContext(workdir=workdir if workdir is not None else scratch, threads=threads,
                                            calibration=_inputs(calibration_clips or []) or None)
            onnx_runners = variants.runners(model, _inputs([example_clip])[0], names, context, skip_unavailable=False)
        onnx_runners.pop(variants.get(variants.REFERENCE).label)
        runners.update(onnx_runners)
    return runners


def ball_check(run: Callable, clips: list, reference: Callable | list, *, threshold: float = 0.5,
               agree_px: float = DEFAULT_AGREE_PX) -> dict:
    """Does ``run`` put the ball where eager FP32 does, on held-out clips? (Chapter 5)"""
    if not clips:
        raise ValueError("need at least one held-out clip")
    inputs = _inputs(clips)
    with torch.no_grad():
        outputs = [run(x).float() for x in inputs]
        ref = reference if isinstance(reference, list) else [reference(x).float() for x in inputs]
    decoded = _decoded(outputs, threshold)
    agree, frames, shift = _detections_agree(decoded, _decoded(ref, threshold), agree_px, MIN_BALL_SCORE)
    truth = scoring.summarize_matches(scoring.match_detections(decoded, clips))
    return {results.BALL_AGREE_FRAMES: int(agree), results.BALL_FRAMES: int(frames),
            results.BALL_SHIFT_PX: float(shift), results.SAME_BALL: bool(agree == frames),
            "ball_detection_rate": float(truth["detection_rate"]),
            "ball_median_error_px": float(truth["median_error_px"])}


def compare_to_reference(output, reference, *, atol: float = SAME_OUTPUT_ATOL) -> dict:
    """How far ``output`` is from ``reference`` (eager FP32's output), the book's one rule (Chapter 3)."""
    def as_array(value):
        if isinstance(value, Mapping):
            value = value[0]
        if hasattr(value, "detach"):
            value = value.detach().float().cpu().numpy()
        return np.asarray(value, dtype=np.float64)

    out, ref = as_array(output), as_array(reference)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference's {ref.shape}")
    diff = float(np.max(np.abs(out - ref))) if out.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    relative = diff / max(1.0, scale)
    result = {MAX_ABS_DIFF: diff, "reference_scale": scale, RELATIVE_DIFF: relative,
              SAME_OUTPUT: bool(relative <= atol)}
    if out.ndim == 4:
        same = (blurball.heatmap_peaks(torch.from_numpy(out)) == blurball.heatmap_peaks(torch.from_numpy(ref))).all(dim=-1)
        result.update({SAME_PEAK_FRAMES: int(same.sum()), PEAK_FRAMES: int(same.numel()),
                       SAME_PEAKS: bool(same.all())})
    return result


def check_batches(model, path: str | Path, input_chw, batch_sizes=BATCH_SIZES, *, threads: int = THREADS,
                  seed: int = 0) -> list[dict]:
    """Serve every batch size from ONE session on ``path`` and compare each with eager ``model`` (Chapter 7)."""
    session = onnx_utils.make_session(path, threads=threads)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in batch_sizes:
        x = torch.randn(b, *input_chw, generator=gen)
        try:
            out = onnx_utils.run_session(session, x)
        except Exception as error:  # ORT's pybind errors: a dimension the model fixed
            rows.append({"batch_size": int(b), "error": str(error).splitlines()[0][:300]})
            continue
        with torch.no_grad():
            reference = model(x)
        rows.append({"batch_size": int(b), "output_shape": tuple(out.shape), **compare_to_reference(out, reference)})
    return rows
