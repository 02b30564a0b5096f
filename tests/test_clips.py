"""Synthetic clips, blur-aware targets and the heatmap decoder (graphbook.clips, Chapter 6)."""
import math

import numpy as np
import pytest

from graphbook import clips


def _label(x, y, angle, half_length, radius=4.0, visible=True):
    return clips.BallLabel(visible, float(x), float(y), float(angle), float(half_length), float(radius))


def _principal_angle(weights):
    """Angle (deg) of the first principal axis of a non-negative weight image."""
    ys, xs = np.nonzero(weights > 0)
    w = weights[ys, xs]
    mx, my = (xs * w).sum() / w.sum(), (ys * w).sum() / w.sum()
    dx, dy = xs - mx, ys - my
    mu20, mu02, mu11 = (w * dx * dx).sum(), (w * dy * dy).sum(), (w * dx * dy).sum()
    return math.degrees(0.5 * math.atan2(2 * mu11, mu20 - mu02)), mx, my


STREAKS = [(40.3, 30.7, 0.0, 8.0), (50.0, 32.2, 35.0, 10.0), (60.6, 35.1, -60.0, 6.0), (45.5, 28.4, 89.0, 12.0),
           (52.0, 33.0, -20.0, 4.0)]


@pytest.mark.parametrize("x, y, angle, half_length", STREAKS)
def test_rendered_streak_matches_its_label(x, y, angle, half_length):
    background = np.full((64, 96, 3), 0.2, np.float32)
    label = _label(x, y, angle, half_length)
    frame = clips.render_ball(background, label)
    change = np.abs(frame - background).sum(axis=2)  # how much the ball changed each pixel
    found_angle, cx, cy = _principal_angle(change)
    assert math.hypot(cx - x, cy - y) < 0.5, (cx, cy)
    assert clips.angle_difference(found_angle, angle) < 3.0
    # The streak is as long as the label says: ends at centre +- l (cos, sin), plus the ball's radius.
    (xa, ya), (xb, yb) = label.endpoints()
    assert math.hypot(xb - xa, yb - ya) == pytest.approx(2 * half_length)
    t = math.radians(angle)
    along = (np.nonzero(change > 0.05)[1] - x) * math.cos(t) + (np.nonzero(change > 0.05)[0] - y) * math.sin(t)
    assert along.max() == pytest.approx(half_length + label.radius, abs=1.5)
    # Time-averaged coverage: the ball is dimmer where it spends less of the exposure.
    assert 0.0 <= frame.min() and frame.max() <= 1.0


def test_unblurred_ball_is_a_round_anti_aliased_disc():
    background = np.zeros((40, 40, 3), np.float32)
    frame = clips.render_ball(background, _label(20.25, 19.5, 0.0, 0.0, radius=5.0))
    alpha = frame.max(axis=2)
    _, cx, cy = _principal_angle(alpha)
    assert math.hypot(cx - 20.25, cy - 19.5) < 0.2
    partial = ((alpha > 0.02) & (alpha < 0.6)).sum()
    assert partial > 10, "the rim should be partially covered (anti-aliased), not a hard edge"


def test_hidden_ball_is_not_drawn_and_has_empty_target():
    background = np.full((32, 48, 3), 0.3, np.float32)
    label = _label(20, 16, 10, 5, visible=False)
    assert np.array_equal(clips.render_ball(background, label), background)
    assert clips.line_target(32, 48, label).sum() == 0


def test_line_target_is_the_streak_thickened_by_the_radius():
    label = _label(30.0, 20.0, 0.0, 10.0)
    target = clips.line_target(40, 64, label)
    assert set(np.unique(target)) == {0.0, 1.0}
    rows, cols = np.nonzero(target)
    assert cols.min() == 20 - 2 and cols.max() == 40 + 2  # 2.5 px beyond each end, on whole pixels
    assert rows.min() == 20 - 2 and rows.max() == 20 + 2
    disc = clips.line_target(40, 64, _label(30.0, 20.0, 45.0, 0.0))
    assert disc.sum() == 29  # pixel centres within radius 3 of a pixel centre


def test_clips_are_deterministic_from_the_seed():
    a = clips.make_clip(7, 48, 64)
    b = clips.make_clip(7, 48, 64)
    c = clips.make_clip(8, 48, 64)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.targets, b.targets)
    assert a.labels == b.labels
    assert not np.array_equal(a.frames, c.frames)
    batch = clips.make_clips(3, seed=5, height=48, width=64)
    again = clips.make_clip(5 * 1_000_003 + 2, 48, 64)
    assert np.array_equal(batch[2].frames, again.frames)
    assert clips.held_out_clips(2, 48, 64)[1].labels == clips.held_out_clips(3, 48, 64)[1].labels


def test_clip_shapes_ranges_and_labelled_targets():
    for clip in clips.make_clips(6, seed=3, height=48, width=80):
        assert clip.frames.shape == (3, 48, 80, 3) and clip.frames.dtype == np.float32
        assert clip.targets.shape == (3, 48, 80)
        assert 0.0 <= clip.frames.min() and clip.frames.max() <= 1.0
        for target, label in zip(clip.targets, clip.labels):
            assert -90.0 <= label.angle_deg < 90.0
            if label.visible:
                assert target[int(round(label.y)), int(round(label.x))] == 1.0
            else:
                assert target.sum() == 0


def test_ball_moves_between_frames_and_blur_follows_the_motion():
    moving = [c for c in clips.make_clips(20, seed=11, height=96, width=160, p_no_ball=0.0, p_hidden_frame=0.0)
              if c.labels[1].half_length > 3]
    assert moving
    for clip in moving:
        l0, l1, l2 = clip.labels
        step = math.degrees(math.atan2(l2.y - l0.y, l2.x - l0.x))
        assert clips.angle_difference(step, l1.angle_deg) < 15.0  # blur points along the trajectory
        assert math.hypot(l2.x - l0.x, l2.y - l0.y) > 2 * l1.half_length  # shutter open less than a frame


def test_tensors_follow_blurball_channel_order():
    clip = clips.make_clip(1, 32, 48)
    x = clips.frames_to_tensor([clip, clip])
    assert tuple(x.shape) == (2, 9, 32, 48)
    assert np.array_equal(x[0, 3:6].numpy(), clip.frames[1].transpose(2, 0, 1))  # frame 1's RGB
    normalized = clips.imagenet_normalize(x)
    assert float(normalized[0, 0, 0, 0]) == pytest.approx((clip.frames[0, 0, 0, 0] - 0.485) / 0.229, abs=1e-5)
    assert tuple(clips.targets_to_tensor([clip]).shape) == (1, 3, 32, 48)


@pytest.mark.parametrize("x, y, angle, half_length", STREAKS + [(40.0, 30.0, 0.0, 0.0)])
def test_decoder_recovers_centre_angle_and_length(x, y, angle, half_length):
    label = _label(x, y, angle, half_length)
    target = clips.line_target(64, 96, label)
    logits = np.where(target > 0, 6.0, -6.0).astype(np.float32)
    decoded = clips.decode_heatmap(logits)
    best = decoded.best
    assert best is not None and len(decoded.candidates) == 1
    assert math.hypot(best.x - x, best.y - y) < 1.0
    assert abs(best.half_length - half_length) < 1.0
    if half_length >= 4:
        assert clips.angle_difference(best.angle_deg, angle) < 4.0
    assert best.area == int(target.sum())


def test_decoder_picks_the_strongest_blob_and_lists_all():
    heat = np.full((40, 60), -8.0, np.float32)
    heat[5:8, 5:8] = 3.0    # small, confident
    heat[20:30, 30:34] = 1.0  # larger, weaker per pixel, more total heat
    heat[35, 55] = 0.2      # a single weak pixel above 0.5 probability
    decoded = clips.decode_heatmap(heat)
    assert len(decoded.candidates) == 3
    assert decoded.best.area == 40 and decoded.best.x == pytest.approx(31.5) and decoded.best.y == pytest.approx(24.5)
    assert decoded.best.angle_deg == pytest.approx(-90.0)  # tall blob: vertical axis
    assert [d.score for d in decoded.candidates] == sorted([d.score for d in decoded.candidates], reverse=True)
    assert clips.decode_heatmap(np.full((10, 10), -3.0)).best is None
    probs = clips.decode_heatmap(np.where(heat > 0.5, 0.9, 0.1), from_logits=False)
    assert len(probs.candidates) == 2  # the weak pixel is now 0.1, below the threshold


def test_heat_weighted_centroid():
    heat = np.zeros((10, 10), np.float32)
    heat[4, 2], heat[4, 3] = 0.6, 0.9
    best = clips.decode_heatmap(heat, from_logits=False).best
    assert best.x == pytest.approx((2 * 0.6 + 3 * 0.9) / 1.5) and best.y == pytest.approx(4.0)
    assert best.score == pytest.approx(1.5)


def test_connected_components_matches_a_flood_fill():
    rng = np.random.default_rng(0)
    for connectivity in (4, 8):
        mask = rng.random((30, 40)) < 0.45
        labels, count = clips.connected_components(mask, connectivity)
        expected = _flood_fill_count(mask, connectivity)
        assert count == expected
        assert labels.max() == count and (labels > 0).sum() == mask.sum()
        # every pair of neighbours in the mask carries the same label
        assert np.all(labels[:, 1:][mask[:, 1:] & mask[:, :-1]] == labels[:, :-1][mask[:, 1:] & mask[:, :-1]])
    spiral = np.zeros((21, 21), bool)  # one long snake-shaped component
    spiral[::2, :] = True
    spiral[1::4, -1] = True
    spiral[3::4, 0] = True
    assert clips.connected_components(spiral)[1] == 1
    assert clips.connected_components(np.zeros((5, 5), bool))[1] == 0


def _flood_fill_count(mask, connectivity):
    seen = np.zeros_like(mask)
    steps = [(0, 1), (1, 0), (0, -1), (-1, 0)] + ([(1, 1), (1, -1), (-1, 1), (-1, -1)] if connectivity == 8 else [])
    count = 0
    for i, j in zip(*np.nonzero(mask)):
        if seen[i, j]:
            continue
        count += 1
        stack = [(i, j)]
        seen[i, j] = True
        while stack:
            a, b = stack.pop()
            for di, dj in steps:
                u, v = a + di, b + dj
                if 0 <= u < mask.shape[0] and 0 <= v < mask.shape[1] and mask[u, v] and not seen[u, v]:
                    seen[u, v] = True
                    stack.append((u, v))
    return count


def test_decoding_ground_truth_scores_perfectly():
    held = clips.make_clips(4, seed=9, height=64, width=96)
    logits = np.stack([np.where(c.targets > 0, 6.0, -6.0) for c in held]).astype(np.float32)
    rows = clips.match_detections(clips.decode_batch(logits), held)
    summary = clips.summarize_matches(rows)
    assert summary["detection_rate"] == 1.0 and summary["false_positive_rate"] in (0.0,) or math.isnan(
        summary["false_positive_rate"])
    assert summary["median_error_px"] < 0.5
    assert len(rows) == 12 and all(isinstance(v, float) for v in summary.values() if not isinstance(v, int))


def test_evaluate_model_with_an_oracle_and_a_blind_model():
    import torch

    held = clips.make_clips(3, seed=4, height=32, width=48, p_no_ball=0.0)
    targets = clips.targets_to_tensor(held)

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            out = targets[self.calls:self.calls + x.shape[0]] * 12 - 6
            self.calls += x.shape[0]
            return {0: out}  # BlurBall's dict output is accepted too

    summary, rows = clips.evaluate_model(Oracle(), held, batch_size=2)
    assert summary["detection_rate"] == 1.0 and len(rows) == 9
    blind, _ = clips.evaluate_model(lambda x: torch.full((x.shape[0], 3, 32, 48), -5.0), held)
    assert blind["detection_rate"] == 0.0 and math.isnan(blind["median_error_px"])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="height"):
        clips.make_clip(0, -5, 64)
    with pytest.raises(ValueError, match="width"):
        clips.render_background(32, 8)
    with pytest.raises(TypeError, match="height"):
        clips.make_clip(0, 32.5, 64)
    with pytest.raises(TypeError, match="seed"):
        clips.make_clip(-1, 32, 64)
    with pytest.raises(ValueError, match="p_no_ball"):
        clips.make_clip(0, 32, 64, p_no_ball=1.5)
    with pytest.raises(ValueError, match="radius_range"):
        clips.make_clip(0, 32, 48, radius_range=(5.0, 30.0))
    with pytest.raises(ValueError, match="n must"):
        clips.make_clips(-2)
    with pytest.raises(ValueError, match="radius"):
        clips.render_ball(np.zeros((20, 20, 3), np.float32), _label(10, 10, 0, 2, radius=0))
    with pytest.raises(ValueError, match="2-D"):
        clips.decode_heatmap(np.zeros((2, 10, 10)))
    with pytest.raises(ValueError, match="threshold"):
        clips.decode_heatmap(np.zeros((10, 10)), threshold=1.5)
    with pytest.raises(ValueError, match=r"\(N, F, H, W\)"):
        clips.decode_batch(np.zeros((10, 10)))
    with pytest.raises(ValueError, match="connectivity"):
        clips.connected_components(np.zeros((4, 4), bool), connectivity=6)
    with pytest.raises(ValueError, match=r"\(N, 3, H, W, 3\)"):
        clips.frames_to_tensor(np.zeros((2, 4, 8, 8, 3)))
    with pytest.raises(ValueError, match="decoded clips"):
        clips.match_detections([], clips.make_clips(1, 0, 32, 32))


def test_angle_helpers():
    assert clips.normalize_angle(100.0) == pytest.approx(-80.0)
    assert clips.normalize_angle(-90.0) == pytest.approx(-90.0)
    assert clips.angle_difference(89.0, -89.0) == pytest.approx(2.0)
    assert clips.angle_difference(10.0, 190.0) == pytest.approx(0.0)


def test_load_trained_blurball_names_the_script_when_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_blurball.py"):
        clips.load_trained_blurball(tmp_path / "absent.pt")
