"""Synthetic 3-frame clips of a motion-blurred ball whose centre, blur angle and length are known exactly: the
article had no frames to say whether a compiled BlurBall still finds the ball. ``x`` = column, ``y`` = row (down)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graphbook.config import FULL_SIZE
from graphbook.model.decoding import normalize_angle

#: Radius (px) of BlurBall's ``binary_line_fixed_size`` target around the streak.
LINE_TARGET_RADIUS = 2.5
#: Radius (px) of the disc drawn instead when the ball is not blurred (half-length 0).
DISC_TARGET_RADIUS = 3.0
#: Seed of the book's held-out clips (:func:`held_out_clips`); training never draws from it.
HELD_OUT_SEED = 2026
#: Seed of the ball check's clips (:func:`check_clips`), a second held-out stream.
CHECK_SEED = 2027
#: What makes the ball check's clips hard: small and fast balls, balls hidden in a frame or partly behind a bar,
#: look-alike clutter, balls cut by the frame's border. A check that passes a known miscompile on easy clips
#: (a dropped summand moved no ball on the 12 frames the matrix first used) cannot vouch for bf16 or INT8.
CHECK_CLIP_SETTINGS = {"radius_range": (1.5, 4.0), "max_speed": 45.0, "p_hidden_frame": 0.15, "clutter": 3.0,
                       "p_partly_hidden": 0.3, "p_near_border": 0.3}

_BALL_COLOURS = (
    (0.97, 0.97, 0.95),  # white ball
    (1.00, 0.55, 0.12),  # orange ball
)


# -- Labels and clips --
@dataclass(frozen=True)
class BallLabel:
    """The ball in one frame: streak centre, blur angle (deg), blur half-length and radius (px). When not ``visible``
    the fields say where it would be and the target is empty."""

    visible: bool
    x: float
    y: float
    angle_deg: float
    half_length: float
    radius: float

    def endpoints(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """The streak's two ends, ``centre -+ half_length * (cos, sin)``."""
        t = math.radians(self.angle_deg)
        dx, dy = self.half_length * math.cos(t), self.half_length * math.sin(t)
        return (self.x - dx, self.y - dy), (self.x + dx, self.y + dy)


@dataclass
class Clip:
    """A 3-frame clip: frames ``(3, H, W, 3)`` in [0, 1], line targets ``(3, H, W)``, labels, its ``seed``."""

    frames: np.ndarray
    targets: np.ndarray
    labels: tuple[BallLabel, ...]
    seed: int | None = None
    info: dict = field(default_factory=dict)


def angle_difference(a_deg: float, b_deg: float) -> float:
    """Smallest difference (deg, in [0, 90]) between two undirected line angles."""
    d = abs(normalize_angle(a_deg - b_deg))
    return float(min(d, 180.0 - d))


# -- Backgrounds --
def _value_noise(rng: np.random.Generator, height: int, width: int, cell: float) -> np.ndarray:
    """Smooth noise in [-1, 1]: random values on a grid of ``cell`` px, bilinearly interpolated."""
    gh, gw = math.ceil(height / cell) + 2, math.ceil(width / cell) + 2
    grid = rng.uniform(-1.0, 1.0, size=(gh, gw)).astype(np.float32)
    ys = np.arange(height, dtype=np.float32) / cell + rng.uniform(0, 1)
    xs = np.arange(width, dtype=np.float32) / cell + rng.uniform(0, 1)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    fy, fx = fy * fy * (3 - 2 * fy), fx * fx * (3 - 2 * fx)  # smoothstep hides the grid
    top, bottom = grid[y0], grid[y0 + 1]
    return ((top[:, x0] * (1 - fx) + top[:, x0 + 1] * fx) * (1 - fy)
            + (bottom[:, x0] * (1 - fx) + bottom[:, x0 + 1] * fx) * fy)


def _polygon_mask(xx: np.ndarray, yy: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Pixels inside a convex polygon given counter- or clockwise corners (x, y)."""
    inside_pos = np.ones_like(xx, dtype=bool)
    inside_neg = np.ones_like(xx, dtype=bool)
    for k in range(len(corners)):
        (x1, y1), (x2, y2) = corners[k], corners[(k + 1) % len(corners)]
        cross = (x2 - x1) * (yy - y1) - (y2 - y1) * (xx - x1)
        inside_pos &= cross >= 0
        inside_neg &= cross <= 0
    return inside_pos | inside_neg


def _segment_distance(xx, yy, x0, y0, x1, y1) -> np.ndarray:
    """Distance from each pixel centre to the segment (x0, y0)-(x1, y1)."""
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    if length2 < 1e-12:
        return np.hypot(xx - x0, yy - y0)
    t = np.clip(((xx - x0) * dx + (yy - y0) * dy) / length2, 0.0, 1.0)
    return np.hypot(xx - (x0 + t * dx), yy - (y0 + t * dy))


def _draw_line(img, xx, yy, p0, p1, width_px, colour, alpha=1.0):
    """Anti-aliased line of ``width_px`` pixels blended into ``img`` (H, W, 3) in place."""
    cover = np.clip(width_px / 2 + 0.5 - _segment_distance(xx, yy, *p0, *p1), 0.0, 1.0) * alpha
    img += cover[..., None] * (np.asarray(colour, np.float32) - img)


def _render_background(height: int, width: int, seed=0, clutter: float = 1.0) -> np.ndarray:
    """A procedural scene ``(H, W, 3)`` with bright look-alikes, so that a detector must use motion and shape."""
    height, width = int(height), int(width)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    c0, c1 = rng.uniform(0.05, 0.8, size=3), rng.uniform(0.05, 0.8, size=3)
    direction = rng.uniform(0, 2 * math.pi)
    ramp = (xx * math.cos(direction) + yy * math.sin(direction))
    ramp = (ramp - ramp.min()) / max(float(ramp.max() - ramp.min()), 1e-6)
    img = (c0 * (1 - ramp[..., None]) + c1 * ramp[..., None]).astype(np.float32)

    for cell, amp in ((rng.uniform(40, 120), rng.uniform(0.03, 0.15)), (rng.uniform(3, 12), rng.uniform(0.0, 0.06))):
        img += amp * _value_noise(rng, height, width, cell)[..., None] * rng.uniform(0.5, 1.0, size=3)

    if rng.random() < 0.6:  # stripes: panels or boards
        period = rng.uniform(8, 60)
        theta = rng.uniform(0, math.pi)
        phase = (xx * math.cos(theta) + yy * math.sin(theta)) / period
        stripes = (np.sin(2 * math.pi * phase) > rng.uniform(-0.5, 0.5)).astype(np.float32)
        img += rng.uniform(-0.15, 0.15) * stripes[..., None] * rng.uniform(0.3, 1.0, size=3)

    if rng.random() < 0.7:  # a table top in perspective, with its lines and a net
        cx, top = rng.uniform(-0.2, 1.2) * width, rng.uniform(0.1, 0.6) * height
        bottom = top + rng.uniform(0.3, 0.9) * height
        half_top, half_bottom = rng.uniform(0.15, 0.4) * width, rng.uniform(0.35, 0.8) * width
        corners = np.array([[cx - half_top, top], [cx + half_top, top], [cx + half_bottom, bottom],
                            [cx - half_bottom, bottom]], dtype=np.float32)
        table_colour = [(0.08, 0.22, 0.55), (0.05, 0.35, 0.2), (0.15, 0.15, 0.2)][rng.integers(3)]
        mask = _polygon_mask(xx, yy, corners)
        img[mask] = np.asarray(table_colour, np.float32) + 0.04 * _value_noise(rng, height, width, 20)[mask][:, None]
        line_w = rng.uniform(1.0, 3.0)
        for k in range(4):
            _draw_line(img, xx, yy, corners[k], corners[(k + 1) % 4], line_w, (0.92, 0.92, 0.9))
        _draw_line(img, xx, yy, (cx, top), (cx, bottom), line_w * 0.7, (0.9, 0.9, 0.88))
        net_y = rng.uniform(top, bottom)
        net_h = rng.uniform(4, 14)
        net = (yy > net_y - net_h) & (yy <= net_y) & (np.abs(xx - cx) < half_bottom * 1.1)
        img[net] = 0.6 * img[net] + 0.4 * np.asarray((0.05, 0.05, 0.08), np.float32)
        _draw_line(img, xx, yy, (cx - half_bottom * 1.1, net_y - net_h), (cx + half_bottom * 1.1, net_y - net_h),
                   rng.uniform(1.0, 2.5), (0.95, 0.95, 0.95))

    for _ in range(rng.poisson(clutter)):  # static look-alikes of the ball
        bx, by, br = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(2, 8)
        cover = np.clip(br + 0.5 - np.hypot(xx - bx, yy - by), 0, 1)
        colour = np.asarray(_BALL_COLOURS[rng.integers(2)], np.float32) * rng.uniform(0.7, 1.0)
        img += cover[..., None] * (colour - img)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


# -- The ball and its target --
def _streak_box(label: BallLabel, reach: float, height: int, width: int) -> tuple[int, int, int, int] | None:
    """Rows ``i0:i1`` and columns ``j0:j1`` within ``reach`` px of the streak, clipped to the frame; None if empty."""
    (xa, ya), (xb, yb) = label.endpoints()
    j0, j1 = max(math.floor(min(xa, xb) - reach), 0), min(math.ceil(max(xa, xb) + reach) + 1, width)
    i0, i1 = max(math.floor(min(ya, yb) - reach), 0), min(math.ceil(max(ya, yb) + reach) + 1, height)
    return (i0, i1, j0, j1) if j0 < j1 and i0 < i1 else None


def _render_ball(img: np.ndarray, label: BallLabel, colour=(0.97, 0.97, 0.95)) -> np.ndarray:
    """A new image with a motion-blurred ball: each pixel is the time average of the shaded disc passing over it."""
    out = np.array(img, dtype=np.float32, copy=True)
    if not label.visible:
        return out
    (xa, ya), (xb, yb) = label.endpoints()
    box = _streak_box(label, label.radius + 1.5, *out.shape[:2])
    if box is None:
        return out
    i0, i1, j0, j1 = box
    s = 3  # samples per pixel side
    offsets = (np.arange(s, dtype=np.float32) + 0.5) / s - 0.5
    sy = (np.arange(i0, i1, dtype=np.float32)[:, None] + offsets[None, :]).reshape(-1)
    sx = (np.arange(j0, j1, dtype=np.float32)[:, None] + offsets[None, :]).reshape(-1)
    syy, sxx = np.meshgrid(sy, sx, indexing="ij")
    steps = max(math.ceil(2 * label.half_length / 0.25) + 1, 1)
    ts = np.linspace(0.0, 1.0, steps, dtype=np.float32) if steps > 1 else np.array([0.5], np.float32)
    coverage = np.zeros_like(sxx)
    shade = np.zeros_like(sxx)
    r2 = label.radius ** 2
    for t in ts:
        cx, cy = xa + (xb - xa) * t, ya + (yb - ya) * t
        d2 = (sxx - cx) ** 2 + (syy - cy) ** 2
        inside = d2 <= r2
        coverage += inside
        # A lit sphere: brighter towards the upper-left, darker at the rim.
        lit = 0.72 + 0.28 * np.sqrt(np.clip(1 - d2 / r2, 0, 1)) - 0.08 * ((sxx - cx) + (syy - cy)) / label.radius
        shade += np.where(inside, lit, 0.0)
    coverage /= len(ts)
    shade /= len(ts)
    h, w = i1 - i0, j1 - j0
    alpha = coverage.reshape(h, s, w, s).mean(axis=(1, 3))
    light = shade.reshape(h, s, w, s).mean(axis=(1, 3))
    ball_rgb = np.asarray(colour, np.float32)[None, None, :] * (light / np.maximum(alpha, 1e-6))[..., None]
    region = out[i0:i1, j0:j1]
    out[i0:i1, j0:j1] = region * (1 - alpha[..., None]) + np.clip(ball_rgb, 0, 1) * alpha[..., None]
    return out


def _line_target(height: int, width: int, label: BallLabel, radius: float = LINE_TARGET_RADIUS,
                disc_radius: float = DISC_TARGET_RADIUS) -> np.ndarray:
    """BlurBall's ``binary_line_fixed_size`` target: 1 within ``radius`` px of the streak, zeros when not visible."""
    height, width = int(height), int(width)
    target = np.zeros((height, width), np.float32)
    if not label.visible:
        return target
    (xa, ya), (xb, yb) = label.endpoints()
    r = disc_radius if label.half_length <= 0 else radius
    box = _streak_box(label, r, height, width)
    if box is None:
        return target
    i0, i1, j0, j1 = box
    yy, xx = np.mgrid[i0:i1, j0:j1].astype(np.float32)
    target[i0:i1, j0:j1] = (_segment_distance(xx, yy, xa, ya, xb, yb) <= r).astype(np.float32)
    return target


def _trajectory(rng, height, width, radius, max_speed, gravity, p_near_border=0.0):
    """Centres and velocities at frames 0, 1, 2 keeping the streak inside (or cut by an edge, ``p_near_border``)."""
    exposure = rng.uniform(0.2, 0.9)  # fraction of the frame interval the shutter is open
    near_border = bool(p_near_border and rng.random() < p_near_border)  # no draw by default: old clips unchanged
    for _ in range(50):
        speed = max_speed * math.sqrt(rng.uniform(0, 1))  # more fast balls than a uniform draw gives
        heading = rng.uniform(0, 2 * math.pi)
        vx, vy = speed * math.cos(heading), speed * math.sin(heading)
        g = rng.uniform(0, gravity)
        margin = 0.0 if near_border else radius + 2
        cx1, cy1 = rng.uniform(margin, width - margin), rng.uniform(margin, height - margin)
        if near_border:  # pull the middle centre to within a radius of the nearest edge
            edge = min((cx1, 0), (width - 1 - cx1, 1), (cy1, 2), (height - 1 - cy1, 3))[1]
            inset = rng.uniform(0, radius)
            cx1, cy1 = {0: (inset, cy1), 1: (width - 1 - inset, cy1), 2: (cx1, inset),
                        3: (cx1, height - 1 - inset)}[edge]
        frames = []
        ok = True
        for k in (-1, 0, 1):
            cx, cy = cx1 + vx * k, cy1 + vy * k + 0.5 * g * k * k
            fvx, fvy = vx, vy + g * k
            half_length = 0.5 * exposure * math.hypot(fvx, fvy)
            angle = normalize_angle(math.degrees(math.atan2(fvy, fvx))) if half_length > 0 else 0.0
            frames.append((cx, cy, angle, half_length))
            t = math.radians(angle)
            for sgn in (-1, 1):
                ex, ey = cx + sgn * half_length * math.cos(t), cy + sgn * half_length * math.sin(t)
                if not (margin <= ex <= width - 1 - margin and margin <= ey <= height - 1 - margin):
                    ok = False
        if ok:
            return frames, exposure
        max_speed *= 0.8  # the crop is too small for this speed: slow down and retry
    return [(cx1, cy1, 0.0, 0.0)] * 3, exposure


def _make_clip(seed=0, height: int = FULL_SIZE[0], width: int = FULL_SIZE[1], *, p_no_ball: float = 0.1,
              p_hidden_frame: float = 0.08, radius_range: tuple[float, float] = (2.5, 6.0),
              max_speed: float | None = None, gravity: float = 2.0, noise: float = 0.02, clutter: float = 1.0,
              p_partly_hidden: float = 0.0, p_near_border: float = 0.0) -> Clip:
    """One synthetic 3-frame clip, fixed by ``seed`` (int or numpy Generator): the ball follows a parabola, blurred over
    the shutter's opening. Sizes are absolute pixels: a 96 x 160 clip looks like a crop of a 288 x 512 scene."""
    height, width = int(height), int(width)
    clip_seed = int(seed) if isinstance(seed, (int, np.integer)) else None
    rng = np.random.default_rng(seed)  # a Generator passes through unchanged
    lo, hi = radius_range
    if max_speed is None:
        max_speed = min(30.0, min(height, width) / 4.0)

    background = _render_background(height, width, rng, clutter)
    radius = float(rng.uniform(lo, hi))
    colour = np.asarray(_BALL_COLOURS[rng.integers(len(_BALL_COLOURS))], np.float32) * rng.uniform(0.8, 1.0)
    path, exposure = _trajectory(rng, height, width, radius, max_speed, gravity, p_near_border)
    has_ball = rng.random() >= p_no_ball
    bar = None
    if p_partly_hidden and rng.random() < p_partly_hidden:  # a bar (a net post, an arm) crossing the middle ball
        (cx, cy), turn, reach = path[1][:2], rng.uniform(0, math.pi), radius * rng.uniform(0.2, 1.0)
        along = np.array([math.cos(turn), math.sin(turn)]) * 40
        centre = np.array([cx, cy]) + reach * np.array([-math.sin(turn), math.cos(turn)])
        bar = (centre - along, centre + along, radius * rng.uniform(1.0, 2.0), rng.uniform(0.05, 0.6, size=3))
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32) if bar else (None, None)
    frames, targets, labels = [], [], []
    for cx, cy, angle, half_length in path:
        visible = bool(has_ball and rng.random() >= p_hidden_frame)
        label = BallLabel(visible, float(cx), float(cy), float(angle), float(half_length), radius)
        frame = _render_ball(background, label, colour)
        if bar:
            _draw_line(frame, xx, yy, *bar)
        frame = frame * rng.uniform(0.96, 1.04) + rng.normal(0, noise, size=frame.shape).astype(np.float32)
        frames.append(np.clip(frame, 0, 1).astype(np.float32))
        targets.append(_line_target(height, width, label))
        labels.append(label)
    return Clip(np.stack(frames), np.stack(targets), tuple(labels), clip_seed,
                {"exposure": float(exposure), "ball_colour": colour.tolist()})


def _make_clips(n: int, seed: int = 0, height: int = FULL_SIZE[0], width: int = FULL_SIZE[1], **kwargs) -> list[Clip]:
    """``n`` clips; clip ``k`` is ``_make_clip(seed * 1_000_003 + k, ...)``, so any one can be regenerated."""
    return [_make_clip(int(seed) * 1_000_003 + k, height, width, **kwargs) for k in range(int(n))]


def held_out_clips(n: int, height: int = FULL_SIZE[0], width: int = FULL_SIZE[1], **kwargs) -> list[Clip]:
    """The book's held-out clips, never seen in training; the first ``n`` are the same for every ``n``."""
    return _make_clips(n, HELD_OUT_SEED, height, width, **kwargs)


def check_clips(n: int, height: int = FULL_SIZE[0], width: int = FULL_SIZE[1]) -> list[Clip]:
    """The ball check's held-out clips: hard enough that logits changed beyond rounding move a decoded ball."""
    return _make_clips(n, CHECK_SEED, height, width, **CHECK_CLIP_SETTINGS)


def training_clip(seed: int, index: int, height: int, width: int, **kwargs) -> Clip:
    """Training clip number ``index`` of the stream ``seed``; disjoint from :func:`held_out_clips`."""
    return _make_clip(np.random.default_rng((int(seed), 0, int(index))), height, width, **kwargs)


#: Fastest ball (px per frame) of the clips the trained checkpoint was trained and scored on.
TRAINED_MAX_SPEED = 30.0


def calibration_clips(n: int, height: int, width: int) -> list[Clip]:
    """The training clips INT8 is calibrated on: never the held-out or check clips a variant is judged on."""
    return [training_clip(0, k, height, width, max_speed=TRAINED_MAX_SPEED) for k in range(n)]


def frames_to_tensor(clips_or_frames):
    """Clips (or frame arrays) as float32 ``(N, 9, H, W)`` in BlurBall's channel order, before normalisation."""
    if isinstance(clips_or_frames, Clip):
        clips_or_frames = [clips_or_frames]
    if isinstance(clips_or_frames, (list, tuple)):
        frames = np.stack([c.frames for c in clips_or_frames])
    else:
        frames = np.asarray(clips_or_frames, dtype=np.float32)
        if frames.ndim == 4:
            frames = frames[None]
    n, f, h, w, c = frames.shape
    chw = np.ascontiguousarray(frames.transpose(0, 1, 4, 2, 3).reshape(n, f * c, h, w), dtype=np.float32)
    return torch.from_numpy(chw)


def targets_to_tensor(clips):
    """Stack the clips' targets into a float32 torch tensor ``(N, 3, H, W)``."""
    if isinstance(clips, Clip):
        clips = [clips]
    return torch.from_numpy(np.ascontiguousarray(np.stack([c.targets for c in clips]), dtype=np.float32))
