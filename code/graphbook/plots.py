"""Small matplotlib helpers shared by the chapters (Chapter 1).

- :func:`bar_with_spread` -- medians as bars, min..max as error bars (the harness's spread).
- :func:`roofline_attainable` and :func:`roofline` -- the roofline model: attainable throughput
  ``min(peak_flops, bandwidth * intensity)`` on log-log axes, with operations placed on it.

Each helper draws on an ``ax`` it is given (or a new one) and returns the ``ax``; none calls
``plt.show()``, so chapters control their own figures.
"""
from __future__ import annotations

from typing import Sequence


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    return ax


def bar_with_spread(labels: Sequence[str], medians: Sequence[float], lows: Sequence[float] | None = None,
                    highs: Sequence[float] | None = None, *, ax=None, ylabel: str = "time per call (ms)",
                    title: str = "", color=None, annotate: bool = True):
    """Bars at the medians with error bars from ``lows`` to ``highs`` (e.g. min and max) (Chapter 1).

    All sequences must have the same length, and each low <= median <= high. With ``annotate`` the
    median is written above each bar.
    """
    labels, medians = list(labels), [float(m) for m in medians]
    if len(labels) != len(medians) or not labels:
        raise ValueError(f"need one median per label, got {len(labels)} labels and {len(medians)} medians")
    yerr = None
    if lows is not None or highs is not None:
        if lows is None or highs is None:
            raise ValueError("give both lows and highs, or neither")
        lows, highs = [float(v) for v in lows], [float(v) for v in highs]
        if not len(lows) == len(highs) == len(medians):
            raise ValueError("lows, highs and medians must have the same length")
        if any(lo > m or m > hi for lo, m, hi in zip(lows, medians, highs)):
            raise ValueError("each low must be <= its median <= its high")
        yerr = [[m - lo for m, lo in zip(medians, lows)], [hi - m for m, hi in zip(medians, highs)]]
    ax = _axes(ax)
    bars = ax.bar(labels, medians, yerr=yerr, capsize=4, color=color)
    if annotate:
        for bar, value in zip(bars, medians):
            ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                        va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=8)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def roofline_attainable(intensity, peak_gflop_per_s: float, bandwidth_gb_per_s: float):
    """Attainable GFLOP/s at arithmetic ``intensity`` (FLOPs per byte; scalar or array) (Chapter 1).

    ``min(peak, bandwidth * intensity)``: below the ridge point ``peak / bandwidth`` memory limits
    the throughput, above it compute does.
    """
    import numpy as np

    if peak_gflop_per_s <= 0 or bandwidth_gb_per_s <= 0:
        raise ValueError("peak and bandwidth must be positive")
    values = np.minimum(peak_gflop_per_s, bandwidth_gb_per_s * np.asarray(intensity, dtype=float))
    return float(values) if values.ndim == 0 else values


def roofline(peak_gflop_per_s: float, bandwidth_gb_per_s: float,
             points: Sequence[tuple] = (), *, ax=None, intensity_range=(1e-2, 1e3),
             title: str = "Roofline"):
    """Draw the roofline and place operations on it (Chapter 1).

    ``points`` holds ``(label, intensity)`` or ``(label, intensity, achieved_gflop_per_s)`` tuples;
    without an achieved value the point sits on the roof (its best case). The ridge point is
    marked with a dotted line.
    """
    import numpy as np

    ax = _axes(ax)
    low, high = intensity_range
    if not 0 < low < high:
        raise ValueError(f"intensity_range must be 0 < low < high, got {intensity_range}")
    xs = np.logspace(np.log10(low), np.log10(high), 200)
    ax.loglog(xs, roofline_attainable(xs, peak_gflop_per_s, bandwidth_gb_per_s), color="black", lw=2,
              label="roof: min(peak, bandwidth x intensity)")
    ridge = peak_gflop_per_s / bandwidth_gb_per_s
    ax.axvline(ridge, color="gray", ls=":", label=f"ridge point ({ridge:.3g} FLOP/byte)")
    for point in points:
        if len(point) not in (2, 3):
            raise ValueError(f"each point is (label, intensity[, achieved]), got {point!r}")
        label, intensity = point[0], float(point[1])
        achieved = (float(point[2]) if len(point) == 3 and point[2] is not None
                    else roofline_attainable(intensity, peak_gflop_per_s, bandwidth_gb_per_s))
        ax.plot([intensity], [achieved], "o", label=label)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable GFLOP/s")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return ax
