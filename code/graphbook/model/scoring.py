"""Scoring the ball detector against ground truth: detection rate, position, angle and length errors."""
from __future__ import annotations

import math

import numpy as np
import torch

from graphbook.model.blurball import imagenet_normalize
from graphbook.model.decoding import FrameDecoding, decode_batch
from graphbook.model.synthetic_clips import Clip, angle_difference, frames_to_tensor

#: Distance (px) under which a detection counts as a hit in :func:`match_detections`.
DEFAULT_HIT_PX = 5.0


def match_detections(decoded: list[list[FrameDecoding]], clips: list[Clip], hit_px: float = DEFAULT_HIT_PX) -> list[dict]:
    """One row per (clip, frame): best detection against label (angle error only for streaks of 3 px and up)."""
    rows = []
    for k, (frames, clip) in enumerate(zip(decoded, clips)):
        for f, (dec, label) in enumerate(zip(frames, clip.labels)):
            best = dec.best
            row = {"clip": k, "frame": f, "visible": label.visible, "detected": best is not None,
                   "label_x": label.x, "label_y": label.y, "label_angle_deg": label.angle_deg,
                   "label_half_length": label.half_length,
                   "x": best.x if best else math.nan, "y": best.y if best else math.nan,
                   "angle_deg": best.angle_deg if best else math.nan,
                   "half_length": best.half_length if best else math.nan,
                   "error_px": math.nan, "angle_error_deg": math.nan, "length_error_px": math.nan, "hit": False}
            if best is not None and label.visible:
                row["error_px"] = math.hypot(best.x - label.x, best.y - label.y)
                row["hit"] = row["error_px"] <= hit_px
                row["length_error_px"] = abs(best.half_length - label.half_length)
                if label.half_length >= 3.0:
                    row["angle_error_deg"] = angle_difference(best.angle_deg, label.angle_deg)
            rows.append(row)
    return rows


def summarize_matches(rows: list[dict]) -> dict:
    """Detection rate, median error over hits and false-positive rate, as plain floats ready for glue."""
    visible = [r for r in rows if r["visible"]]
    hidden = [r for r in rows if not r["visible"]]
    hits = [r for r in visible if r["hit"]]

    def median(values):
        values = [v for v in values if not math.isnan(v)]
        return float(np.median(values)) if values else math.nan

    return {
        "frames": len(rows), "visible_frames": len(visible),
        "detection_rate": len(hits) / len(visible) if visible else math.nan,
        "median_error_px": median([r["error_px"] for r in hits]),
        "median_angle_error_deg": median([r["angle_error_deg"] for r in hits]),
        "median_length_error_px": median([r["length_error_px"] for r in hits]),
        "false_positive_rate": (sum(r["detected"] for r in hidden) / len(hidden)) if hidden else math.nan,
    }


def evaluate_model(model, clips: list[Clip], *, batch_size: int = 4, threshold: float = 0.5,
                   hit_px: float = DEFAULT_HIT_PX) -> tuple[dict, list[dict]]:
    """``(summary, rows)`` of ``model`` on held-out clips, under ``torch.no_grad`` in the model's current mode."""
    decoded = []
    with torch.no_grad():
        for start in range(0, len(clips), batch_size):
            out = model(imagenet_normalize(frames_to_tensor(clips[start:start + batch_size])))
            decoded.extend(decode_batch(out, threshold))  # decode_batch takes BlurBall's {0: logits} too
    rows = match_detections(decoded, clips, hit_px)
    return summarize_matches(rows), rows
