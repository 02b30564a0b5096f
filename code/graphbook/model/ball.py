"""Does a variant still put the ball where eager FP32 does? BlurBall's task-level check (Chapters 5-7): decode the
heatmaps of held-out clips and compare the decoded balls frame by frame."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch

from graphbook.config import FULL_SIZE
from graphbook.model import blurball, decoding, scoring, synthetic_clips
from graphbook.record import results

#: Two detections "agree" when their centres are within this many pixels (half a pixel: same blob, same place).
DEFAULT_AGREE_PX = 0.5
#: A "clear" ball: a decoded blob whose heat sums to at least this (a few pixels over the threshold). The ball check
#: judges the frames where either side decodes one: which of two specks just over 0.5 ranks first is a coin toss
#: any rounding flips, and a blob that crosses the line on one side only is still in the same place.
MIN_BALL_SCORE = 2.0


def clip_inputs(clips: list, batch_size: int = 1) -> list[torch.Tensor]:
    """The clips as normalised model inputs, ``batch_size`` clips each."""
    return [blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(clips[i:i + batch_size]))
            for i in range(0, len(clips), batch_size)]


def decoded(outputs, threshold: float) -> list:
    return [d for out in outputs for d in decoding.decode_batch(out, threshold)]


def detections_agree(a: list[list], b: list[list], agree_px: float = DEFAULT_AGREE_PX,
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


def check(run: Callable, clips: list, reference: Callable | list, *, threshold: float = 0.5,
               agree_px: float = DEFAULT_AGREE_PX) -> dict:
    """Does ``run`` put the ball where eager FP32 does, on held-out clips? (Chapter 5)"""
    if not clips:
        raise ValueError("need at least one held-out clip")
    inputs = clip_inputs(clips)
    with torch.no_grad():
        outputs = [run(x).float() for x in inputs]
        ref = reference if isinstance(reference, list) else [reference(x).float() for x in inputs]
    found = decoded(outputs, threshold)
    agree, frames, shift = detections_agree(found, decoded(ref, threshold), agree_px, MIN_BALL_SCORE)
    truth = scoring.summarize_matches(scoring.match_detections(found, clips))
    return {results.BALL_AGREE_FRAMES: int(agree), results.BALL_FRAMES: int(frames),
            results.BALL_SHIFT_PX: float(shift), results.SAME_BALL: bool(agree == frames),
            "ball_detection_rate": float(truth["detection_rate"]),
            "ball_median_error_px": float(truth["median_error_px"])}


def same_ball(outputs: list, references: list, *, threshold: float = 0.5, agree_px: float = DEFAULT_AGREE_PX) -> dict:
    """The ball check as the your-model command's ``MODULE:FN`` (Chapter 8): every frame's decoded ball where eager
    FP32 puts it. ``statistic`` is the largest shift in pixels, against the ``limit`` of ``agree_px``."""
    agree, frames, shift = detections_agree(decoded(outputs, threshold), decoded(references, threshold), agree_px,
                                            MIN_BALL_SCORE)
    return {"passed": agree == frames, "failures": frames - agree, "samples": frames, "statistic": shift,
            "limit": agree_px}


def save_command_inputs(path, *, calibration: int = 16, check: int = 16, height: int = FULL_SIZE[0],
                        width: int = FULL_SIZE[1]) -> Path:
    """The your-model command's inputs file for BlurBall: ``calibration`` training clips first (what INT8 is
    calibrated on), then ``check`` hard check clips (what every variant is judged on)."""
    clips = synthetic_clips.calibration_clips(calibration, height, width) + synthetic_clips.check_clips(check, height,
                                                                                                          width)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torch.cat(clip_inputs(clips)), path)
    return path
