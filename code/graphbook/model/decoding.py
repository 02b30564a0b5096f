"""The heatmap decoder: BlurBall's logits back into ball positions, blur angles and lengths, as BlurBall's own
decoder does (``x`` = column, ``y`` = row, undirected angles in ``[-90, 90)`` deg)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def normalize_angle(angle_deg: float) -> float:
    """Map an undirected line angle to ``[-90, 90)`` degrees."""
    return float((angle_deg + 90.0) % 180.0 - 90.0)

@dataclass(frozen=True)
class Detection:
    """One candidate blob: heat-weighted centroid, summed heat, principal-axis angle and extent, area; ``half_length``
    is the extent less the half extent across the axis: the blur half-length, whatever the blob's thickness."""

    x: float
    y: float
    score: float
    angle_deg: float
    half_extent: float
    half_length: float
    area: int


@dataclass(frozen=True)
class FrameDecoding:
    """The best detection of one frame (highest score) or None, and all candidates."""

    best: Detection | None
    candidates: tuple[Detection, ...]


def _as_numpy(array) -> np.ndarray:
    if hasattr(array, "detach"):  # torch tensor, on any device and dtype
        array = array.detach().float().cpu().numpy()
    return np.asarray(array, dtype=np.float32)


def _connected_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """``(labels, count)`` of the 8-connected components of a 2-D boolean mask, in raster order of their first pixel.
    Vectorised label propagation with pointer jumping: rounds grow with the log of a blob's size, not its area."""
    height, width = mask.shape
    labels_img = np.zeros((height, width), np.int32)
    rows, cols = np.nonzero(mask)
    n = rows.size
    if n == 0:
        return labels_img, 0
    index = np.full((height + 2, width + 2), -1, np.int64)  # padded so neighbours never go out of range
    index[rows + 1, cols + 1] = np.arange(n)
    a_list, b_list = [], []
    for di, dj in ((0, 1), (1, 0), (1, 1), (1, -1)):
        nb = index[rows + 1 + di, cols + 1 + dj]
        keep = nb >= 0
        a_list.append(np.nonzero(keep)[0])
        b_list.append(nb[keep])
    a, b = np.concatenate(a_list), np.concatenate(b_list)
    parent = np.arange(n)
    while True:
        low = np.minimum(parent[a], parent[b])
        new = parent.copy()
        np.minimum.at(new, parent[a], low)  # hook representatives, not just the pixels
        np.minimum.at(new, parent[b], low)
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        while True:  # pointer jumping
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, parent):
            break
        parent = new
    roots, compact = np.unique(parent, return_inverse=True)  # roots are the smallest index = raster order
    labels_img[rows, cols] = compact.astype(np.int32) + 1
    return labels_img, int(roots.size)


def _blob_detection(ys: np.ndarray, xs: np.ndarray, heat: np.ndarray) -> Detection:
    weight = float(heat.sum())
    cx = float((xs * heat).sum() / weight) if weight > 0 else float(xs.mean())
    cy = float((ys * heat).sum() / weight) if weight > 0 else float(ys.mean())
    # Moments of the binary blob (the spec): the angle of the major axis from the x axis towards y.
    mx, my = xs.mean(), ys.mean()
    dx, dy = xs - mx, ys - my
    mu20, mu02, mu11 = float((dx * dx).mean()), float((dy * dy).mean()), float((dx * dy).mean())
    theta = 0.5 * math.atan2(2 * mu11, mu20 - mu02)
    along = dx * math.cos(theta) + dy * math.sin(theta)
    across = -dx * math.sin(theta) + dy * math.cos(theta)
    half_extent = 0.5 * float(along.max() - along.min())
    half_width = 0.5 * float(across.max() - across.min())
    return Detection(x=cx, y=cy, score=weight, angle_deg=normalize_angle(math.degrees(theta)),
                     half_extent=half_extent, half_length=max(half_extent - half_width, 0.0), area=int(xs.size))


def _decode_heatmap(heatmap, threshold: float = 0.5) -> FrameDecoding:
    """Decode one frame's ``(H, W)`` heatmap: sigmoid, threshold, 8-connected components, one detection each."""
    heat = _as_numpy(heatmap)
    heat = 1.0 / (1.0 + np.exp(-np.clip(heat, -60.0, 60.0)))
    mask = heat > threshold
    labels, count = _connected_components(mask)
    if count == 0:
        return FrameDecoding(None, ())
    rows, cols = np.nonzero(labels)
    comp = labels[rows, cols]
    order = np.argsort(comp, kind="stable")
    rows, cols, comp = rows[order], cols[order], comp[order]
    starts = np.searchsorted(comp, np.arange(1, count + 1))
    ends = np.append(starts[1:], comp.size)
    found = sorted((_blob_detection(rows[s:e].astype(np.float64), cols[s:e].astype(np.float64),
                                    heat[rows[s:e], cols[s:e]].astype(np.float64)) for s, e in zip(starts, ends)),
                   key=lambda d: -d.score)
    return FrameDecoding(found[0], tuple(found))


def decode_clip(heatmaps, threshold: float = 0.5) -> list[FrameDecoding]:
    """Decode the ``(F, H, W)`` heatmaps of one clip."""
    return [_decode_heatmap(h, threshold) for h in _as_numpy(heatmaps)]


def decode_batch(heatmaps, threshold: float = 0.5) -> list[list[FrameDecoding]]:
    """Decode a batch of heatmaps ``(N, F, H, W)`` (the model's output)."""
    if isinstance(heatmaps, dict):  # BlurBall's raw output {0: logits}
        heatmaps = heatmaps[0]
    heat = _as_numpy(heatmaps)
    return [decode_clip(h, threshold) for h in heat]
