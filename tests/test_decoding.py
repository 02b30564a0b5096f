"""The heatmap decoder (graphbook.model.decoding, Chapter 6)."""
import math

import numpy as np
import pytest

from graphbook.model import decoding, synthetic_clips


def _label(x, y, angle, half_length, radius=4.0, visible=True):
    return synthetic_clips.BallLabel(visible, float(x), float(y), float(angle), float(half_length), float(radius))


STREAKS = [(40.3, 30.7, 0.0, 8.0), (50.0, 32.2, 35.0, 10.0), (60.6, 35.1, -60.0, 6.0), (45.5, 28.4, 89.0, 12.0),
           (52.0, 33.0, -20.0, 4.0)]


@pytest.mark.parametrize("x, y, angle, half_length", STREAKS + [(40.0, 30.0, 0.0, 0.0)])
def test_decoder_recovers_centre_angle_and_length(x, y, angle, half_length):
    label = _label(x, y, angle, half_length)
    target = synthetic_clips._line_target(64, 96, label)
    logits = np.where(target > 0, 6.0, -6.0).astype(np.float32)
    decoded = decoding._decode_heatmap(logits)
    best = decoded.best
    assert best is not None and len(decoded.candidates) == 1
    assert math.hypot(best.x - x, best.y - y) < 1.0
    assert abs(best.half_length - half_length) < 1.0
    if half_length >= 4:
        assert synthetic_clips.angle_difference(best.angle_deg, angle) < 4.0
    assert best.area == int(target.sum())


def test_decoder_picks_the_strongest_blob_lists_all_weighs_by_heat_and_its_components_match_a_flood_fill():
    heat = np.full((40, 60), -8.0, np.float32)
    heat[5:8, 5:8] = 3.0    # small, confident
    heat[20:30, 30:34] = 1.0  # larger, weaker per pixel, more total heat
    heat[35, 55] = 0.2      # a single weak pixel above 0.5 probability
    decoded = decoding._decode_heatmap(heat)
    assert len(decoded.candidates) == 3
    assert decoded.best.area == 40 and decoded.best.x == pytest.approx(31.5) and decoded.best.y == pytest.approx(24.5)
    assert decoded.best.angle_deg == pytest.approx(-90.0)  # tall blob: vertical axis
    assert [d.score for d in decoded.candidates] == sorted([d.score for d in decoded.candidates], reverse=True)
    assert decoding._decode_heatmap(np.full((10, 10), -3.0)).best is None
    probs = decoding._decode_heatmap(np.where(heat > 0.5, 2.2, -2.2))
    assert len(probs.candidates) == 2  # the weak pixel is now at probability 0.1, below the threshold
    heat = np.full((10, 10), -10.0, np.float32)
    heat[4, 2], heat[4, 3] = np.log(0.6 / 0.4), np.log(0.9 / 0.1)   # the logits of 0.6 and 0.9
    best = decoding._decode_heatmap(heat).best
    assert best.x == pytest.approx((2 * 0.6 + 3 * 0.9) / 1.5) and best.y == pytest.approx(4.0)
    assert best.score == pytest.approx(1.5)
    mask = np.random.default_rng(0).random((30, 40)) < 0.45
    labels, count = decoding._connected_components(mask)
    assert count == _flood_fill_count(mask)
    assert labels.max() == count and (labels > 0).sum() == mask.sum()
    # every pair of neighbours in the mask carries the same label
    assert np.all(labels[:, 1:][mask[:, 1:] & mask[:, :-1]] == labels[:, :-1][mask[:, 1:] & mask[:, :-1]])
    spiral = np.zeros((21, 21), bool)  # one long snake-shaped component
    spiral[::2, :] = True
    spiral[1::4, -1] = True
    spiral[3::4, 0] = True
    assert decoding._connected_components(spiral)[1] == 1
    assert decoding._connected_components(np.zeros((5, 5), bool))[1] == 0


def _flood_fill_count(mask):
    seen = np.zeros_like(mask)
    count = 0
    for i, j in zip(*np.nonzero(mask)):
        if seen[i, j]:
            continue
        count += 1
        stack = [(i, j)]
        seen[i, j] = True
        while stack:
            a, b = stack.pop()
            for u, v in ((a + di, b + dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)):
                if 0 <= u < mask.shape[0] and 0 <= v < mask.shape[1] and mask[u, v] and not seen[u, v]:
                    seen[u, v] = True
                    stack.append((u, v))
    return count
