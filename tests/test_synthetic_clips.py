"""Synthetic clips and their blur-aware targets (graphbook.model.synthetic_clips, Chapter 6)."""
import math

import numpy as np
import pytest

from graphbook.model import blurball, decoding, synthetic_clips


def _label(x, y, angle, half_length, radius=4.0, visible=True):
    return synthetic_clips.BallLabel(visible, float(x), float(y), float(angle), float(half_length), float(radius))


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
    frame = synthetic_clips._render_ball(background, label)
    change = np.abs(frame - background).sum(axis=2)  # how much the ball changed each pixel
    found_angle, cx, cy = _principal_angle(change)
    assert math.hypot(cx - x, cy - y) < 0.5, (cx, cy)
    assert synthetic_clips.angle_difference(found_angle, angle) < 3.0
    # The streak is as long as the label says: ends at centre +- l (cos, sin), plus the ball's radius.
    (xa, ya), (xb, yb) = label.endpoints()
    assert math.hypot(xb - xa, yb - ya) == pytest.approx(2 * half_length)
    t = math.radians(angle)
    along = (np.nonzero(change > 0.05)[1] - x) * math.cos(t) + (np.nonzero(change > 0.05)[0] - y) * math.sin(t)
    assert along.max() == pytest.approx(half_length + label.radius, abs=1.5)
    # Time-averaged coverage: the ball is dimmer where it spends less of the exposure.
    assert 0.0 <= frame.min() and frame.max() <= 1.0


def test_an_unblurred_ball_is_a_round_disc_a_target_the_streak_thickened_and_a_hidden_ball_not_drawn():
    background = np.zeros((40, 40, 3), np.float32)
    frame = synthetic_clips._render_ball(background, _label(20.25, 19.5, 0.0, 0.0, radius=5.0))
    alpha = frame.max(axis=2)
    _, cx, cy = _principal_angle(alpha)
    assert math.hypot(cx - 20.25, cy - 19.5) < 0.2
    partial = ((alpha > 0.02) & (alpha < 0.6)).sum()
    assert partial > 10, "the rim should be partially covered (anti-aliased), not a hard edge"
    label = _label(30.0, 20.0, 0.0, 10.0)
    target = synthetic_clips._line_target(40, 64, label)
    assert set(np.unique(target)) == {0.0, 1.0}
    rows, cols = np.nonzero(target)
    assert cols.min() == 20 - 2 and cols.max() == 40 + 2  # 2.5 px beyond each end, on whole pixels
    assert rows.min() == 20 - 2 and rows.max() == 20 + 2
    disc = synthetic_clips._line_target(40, 64, _label(30.0, 20.0, 45.0, 0.0))
    assert disc.sum() == 29  # pixel centres within radius 3 of a pixel centre
    background = np.full((32, 48, 3), 0.3, np.float32)
    hidden = _label(20, 16, 10, 5, visible=False)
    assert np.array_equal(synthetic_clips._render_ball(background, hidden), background)
    assert synthetic_clips._line_target(32, 48, hidden).sum() == 0


def test_clips_are_deterministic_from_the_seed_with_their_shapes_ranges_and_labelled_targets():
    a = synthetic_clips._make_clip(7, 48, 64)
    b = synthetic_clips._make_clip(7, 48, 64)
    c = synthetic_clips._make_clip(8, 48, 64)
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.targets, b.targets)
    assert a.labels == b.labels
    assert not np.array_equal(a.frames, c.frames)
    batch = synthetic_clips._make_clips(3, seed=5, height=48, width=64)
    again = synthetic_clips._make_clip(5 * 1_000_003 + 2, 48, 64)
    assert np.array_equal(batch[2].frames, again.frames)
    assert synthetic_clips.held_out_clips(2, 48, 64)[1].labels == synthetic_clips.held_out_clips(3, 48, 64)[1].labels
    for clip in synthetic_clips._make_clips(6, seed=3, height=48, width=80):
        assert clip.frames.shape == (3, 48, 80, 3) and clip.frames.dtype == np.float32
        assert clip.targets.shape == (3, 48, 80)
        assert 0.0 <= clip.frames.min() and clip.frames.max() <= 1.0
        for target, label in zip(clip.targets, clip.labels):
            assert -90.0 <= label.angle_deg < 90.0
            if label.visible:
                assert target[int(round(label.y)), int(round(label.x))] == 1.0
            else:
                assert target.sum() == 0


def test_check_clips_are_harder_the_held_out_ones_unchanged_and_blur_follows_the_motion():
    clips = synthetic_clips.check_clips(12, 48, 80)
    labels = [label for clip in clips for label in clip.labels]
    assert all(1.5 <= label.radius <= 4.0 for label in labels)
    assert any(min(label.x, 79 - label.x, label.y, 47 - label.y) < label.radius for label in labels)   # at the border
    assert synthetic_clips.check_clips(2, 48, 80)[1].labels == clips[1].labels
    bare = synthetic_clips._make_clip(3, 48, 80, p_no_ball=0.0, p_hidden_frame=0.0)
    barred = synthetic_clips._make_clip(3, 48, 80, p_no_ball=0.0, p_hidden_frame=0.0, p_partly_hidden=1.0)
    y, x = round(bare.labels[1].y), round(bare.labels[1].x)
    over_the_ball = np.abs(barred.frames[1] - bare.frames[1])[max(y - 4, 0):y + 5, max(x - 4, 0):x + 5]
    assert barred.labels == bare.labels and over_the_ball.max() > 0.3   # more than sensor noise and flicker
    # the new settings draw nothing when off: the recorded held-out stream is the one the book always used
    assert synthetic_clips.held_out_clips(1, 96, 160, max_speed=30.0)[0].labels[0].x == pytest.approx(111.1404423190692)
    moving = [c for c in synthetic_clips._make_clips(20, seed=11, height=96, width=160, p_no_ball=0.0, p_hidden_frame=0.0)
              if c.labels[1].half_length > 3]
    assert moving
    for clip in moving:
        l0, l1, l2 = clip.labels
        step = math.degrees(math.atan2(l2.y - l0.y, l2.x - l0.x))
        assert synthetic_clips.angle_difference(step, l1.angle_deg) < 15.0  # blur points along the trajectory
        assert math.hypot(l2.x - l0.x, l2.y - l0.y) > 2 * l1.half_length  # shutter open less than a frame


def test_tensors_follow_blurball_channel_order_and_angles_are_undirected():
    clip = synthetic_clips._make_clip(1, 32, 48)
    x = synthetic_clips.frames_to_tensor([clip, clip])
    assert tuple(x.shape) == (2, 9, 32, 48)
    assert np.array_equal(x[0, 3:6].numpy(), clip.frames[1].transpose(2, 0, 1))  # frame 1's RGB
    normalized = blurball.imagenet_normalize(x)
    assert float(normalized[0, 0, 0, 0]) == pytest.approx((clip.frames[0, 0, 0, 0] - 0.485) / 0.229, abs=1e-5)
    assert tuple(synthetic_clips.targets_to_tensor([clip]).shape) == (1, 3, 32, 48)
    assert decoding.normalize_angle(100.0) == pytest.approx(-80.0)
    assert decoding.normalize_angle(-90.0) == pytest.approx(-90.0)
    assert synthetic_clips.angle_difference(89.0, -89.0) == pytest.approx(2.0)
    assert synthetic_clips.angle_difference(10.0, 190.0) == pytest.approx(0.0)
