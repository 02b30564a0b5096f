"""Small matplotlib helpers shared by the chapters. Each draws on the ``ax`` it is given (or a new one) and
returns it; none calls ``plt.show()``, so chapters control their own figures."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch

from graphbook.teach import fusion_rules

if TYPE_CHECKING:  # only for the annotations: importing fusion_rules at run time would load torch
    from graphbook.teach.fusion_rules import FusionGroup


def _axes(ax):
    if ax is None:
        _, ax = plt.subplots()
    return ax


def bar_with_spread(labels: Sequence[str], medians: Sequence[float], lows: Sequence[float] | None = None,
                    highs: Sequence[float] | None = None, *, ax=None, ylabel: str = "time per call (ms)",
                    title: str = "", color=None, annotate: bool = True):
    """Bars at the medians with error bars from ``lows`` to ``highs`` (e.g. min and max)."""
    labels, medians = list(labels), [float(m) for m in medians]
    yerr = None
    if lows is not None or highs is not None:
        lows, highs = [float(v) for v in lows], [float(v) for v in highs]
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


def speedup_waterfall(labels: Sequence[str], steps: Sequence[float], total: float, *, step_ranges=None,
                      total_range=None, ax=None, title: str = ""):
    """Each cause's speed-up step as a bar on a log axis, their product beside the ``total`` measured directly. The gap
    is written as the residual: causes that do not account for the total are shown, never hidden."""
    labels, steps = list(labels), [float(s) for s in steps]
    ax = _axes(ax)
    level = 1.0
    for i, (label, step) in enumerate(zip(labels, steps)):
        top = level * step
        color = "tab:green" if step >= 1 else "tab:red"
        ax.bar(i, math.log10(max(top, level)) - math.log10(min(top, level)), bottom=math.log10(min(top, level)),
               color=color, width=0.6)
        if step_ranges is not None:
            lo, hi = step_ranges[i]
            ax.plot([i, i], [math.log10(level * lo), math.log10(level * hi)], color="black", lw=1)
        ax.annotate(f"{step:.2f}x", (i, math.log10(max(top, level))), ha="center", va="bottom", xytext=(0, 3),
                    textcoords="offset points", fontsize=8)
        level = top
    n = len(steps)
    ax.bar(n, math.log10(total), bottom=0, color="tab:blue", width=0.6)
    if total_range is not None:
        ax.plot([n, n], [math.log10(total_range[0]), math.log10(total_range[1])], color="black", lw=1)
    ax.annotate(f"{total:.2f}x measured\n(rungs: {level:.2f}x, residual {total / level:.2f})", (n, math.log10(total)),
                ha="center", va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(n + 1), labels + ["total"], rotation=20, ha="right")
    ticks = [t for t in (0.5, 1, 1.5, 2, 3, 4, 6, 8, 12) if t <= max(level, total, 1) * 1.6]
    ax.set_yticks([math.log10(t) for t in ticks], [f"{t:g}x" for t in ticks])
    ax.set_ylabel("speed-up over eager (log scale)")
    if title:
        ax.set_title(title)
    return ax


def flow_diagram(boxes: dict, arrows: Sequence[tuple], *, ax=None, title: str = "", width: float = 2.3,
                 height: float = 0.9):
    """Boxes at ``(x, y, text[, colour])`` joined by ``(from, to[, label[, style]])`` arrows; ``"dashed"`` for a
    path taken only sometimes. KeyError for an arrow to an unknown box."""
    ax = _axes(ax)
    for key, spec in boxes.items():
        x, y, text = spec[:3]
        colour = spec[3] if len(spec) > 3 else "#e8eef7"
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height, boxstyle="round,pad=0.05",
                                    facecolor=colour, edgecolor="#445", linewidth=0.8))
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, wrap=True)
    for arrow in arrows:
        source, target = arrow[0], arrow[1]
        if source not in boxes or target not in boxes:
            raise KeyError(f"arrow {source!r} -> {target!r} names a box that is not drawn")
        label = arrow[2] if len(arrow) > 2 else ""
        style = arrow[3] if len(arrow) > 3 else "solid"
        (x0, y0), (x1, y1) = boxes[source][:2], boxes[target][:2]
        dx, dy = x1 - x0, y1 - y0
        shrink_x = (width / 2 + 0.08) if abs(dx) >= abs(dy) * width / height else 0
        shrink_y = 0 if shrink_x else height / 2 + 0.08
        sx = shrink_x * (1 if dx > 0 else -1) if dx else 0
        sy = shrink_y * (1 if dy > 0 else -1) if dy else 0
        ax.annotate("", xy=(x1 - sx, y1 - sy), xytext=(x0 + sx, y0 + sy),
                    arrowprops=dict(arrowstyle="->", color="#334", lw=0.9,
                                    linestyle="--" if style == "dashed" else "-",
                                    connectionstyle="arc3,rad=0.25" if style == "dashed" else "arc3"))
        if label:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, ha="center", va="bottom", fontsize=6.5,
                    color="#334")
    xs = [b[0] for b in boxes.values()]
    ys = [b[1] for b in boxes.values()]
    ax.set_xlim(min(xs) - width, max(xs) + width)
    ax.set_ylim(min(ys) - 1.2 * height, max(ys) + 1.2 * height)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def _roofline_attainable(intensity, peak_gflop_per_s: float, bandwidth_gb_per_s: float):
    """Attainable GFLOP/s at arithmetic ``intensity`` (FLOPs per byte): ``min(peak, bandwidth * intensity)``."""
    values = np.minimum(peak_gflop_per_s, bandwidth_gb_per_s * np.asarray(intensity, dtype=float))
    return float(values) if values.ndim == 0 else values


def roofline(peak_gflop_per_s: float, bandwidth_gb_per_s: float,
             points: Sequence[tuple] = (), *, ax=None, intensity_range=(1e-2, 1e3),
             title: str = "Roofline"):
    """The roofline with ``(label, intensity[, achieved])`` points on it (without an achieved value: on the roof)."""
    ax = _axes(ax)
    low, high = intensity_range
    xs = np.logspace(np.log10(low), np.log10(high), 200)
    ax.loglog(xs, _roofline_attainable(xs, peak_gflop_per_s, bandwidth_gb_per_s), color="black", lw=2,
              label="roof: min(peak, bandwidth x intensity)")
    ridge = peak_gflop_per_s / bandwidth_gb_per_s
    ax.axvline(ridge, color="gray", ls=":", label=f"ridge point ({ridge:.3g} FLOP/byte)")
    for point in points:
        label, intensity = point[0], float(point[1])
        achieved = (float(point[2]) if len(point) == 3 and point[2] is not None
                    else _roofline_attainable(intensity, peak_gflop_per_s, bandwidth_gb_per_s))
        ax.plot([intensity], [achieved], "o", label=label)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable GFLOP/s")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return ax


#: Fill colour of each TVM operator class in :func:`draw_fusion_groups`.
_OP_CLASS_COLOURS = {"injective": "#9ecae1", "reduction": "#fdae6b", "complex-out-fusable": "#a1d99b",
                     "opaque": "#d9d9d9"}


def draw_fusion_groups(graph, groups: Sequence[FusionGroup] | None = None, ax=None, title: str = "",
                       legend: bool = True):
    """A small FX graph (a few dozen nodes) top to bottom, nodes coloured by TVM class, each fusion group boxed."""
    gm = fusion_rules.as_graph_module(graph)
    groups = list(groups) if groups is not None else fusion_rules.fuse_groups(gm)
    infos = {i.name: i for i in fusion_rules.classify_graph(gm)}
    user_inputs = gm.meta.get("user_inputs")
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and n.users
              and (user_inputs is None or n.name in user_inputs)]
    shown = inputs + fusion_rules.compute_nodes(gm)
    layer: dict[str, int] = {}  # one more than the deepest shown input, inputs at 0
    for node in shown:
        layer[node.name] = 1 + max((layer[p.name] for p in node.all_input_nodes if p.name in layer), default=-1)
    by_layer: dict[int, list[str]] = {}
    for node in shown:
        by_layer.setdefault(layer[node.name], []).append(node.name)
    pos = {name: (k - (len(row) - 1) / 2.0, -depth) for depth, row in by_layer.items() for k, name in enumerate(row)}
    if ax is None:
        height = 0.75 * (len(by_layer) + 1)
        _, ax = plt.subplots(figsize=(6.5, max(2.5, height)))
    box_w, box_h = 0.8, 0.5
    for g in groups:
        xs = [pos[m][0] for m in g.nodes]
        ys = [pos[m][1] for m in g.nodes]
        pad = 0.12
        ax.add_patch(FancyBboxPatch((min(xs) - box_w / 2 - pad, min(ys) - box_h / 2 - pad),
                                    max(xs) - min(xs) + box_w + 2 * pad,
                                    max(ys) - min(ys) + box_h + 2 * pad,
                                    boxstyle="round,pad=0.02", fc="#fff7bc", ec="#b8860b",
                                    lw=1.2, ls="--", zorder=0))
        ax.text(max(xs) + box_w / 2 + pad + 0.05, (min(ys) + max(ys)) / 2, f"group {g.index}",
                va="center", ha="left", fontsize=8, color="#8b6508")
    for node in shown:
        x, y = pos[node.name]
        for pred in node.all_input_nodes:
            if pred.name in pos:
                px, py = pos[pred.name]
                if abs(py - y) > 1.01 and abs(px - x) < 0.01:
                    # an edge that skips layers in one column runs down the left side, around the boxes
                    side = x - box_w / 2 - 0.22
                    ax.plot([px - box_w / 2, side, side], [py, py, y], color="#555555", lw=0.8, zorder=1)
                    ax.annotate("", xy=(x - box_w / 2, y), xytext=(side, y),
                                arrowprops=dict(arrowstyle="->", color="#555555", lw=0.8), zorder=1)
                else:
                    ax.annotate("", xy=(x, y + box_h / 2), xytext=(px, py - box_h / 2),
                                arrowprops=dict(arrowstyle="->", color="#555555", lw=0.8), zorder=1)
        if node.op == "placeholder":
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h,
                                        boxstyle="round,pad=0.02,rounding_size=0.2", fc="white",
                                        ec="#888888", zorder=2))
            label = node.name
        else:
            info = infos[node.name]
            ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h,
                                        boxstyle="round,pad=0.02", fc=_OP_CLASS_COLOURS[info.op_class.value],
                                        ec="#333333", zorder=2))
            label = info.op
        ax.text(x, y, label, ha="center", va="center", fontsize=8, zorder=3)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 1.0, max(xs) + 1.6)
    ax.set_ylim(min(ys) - (1.6 if legend else 0.7), max(ys) + 0.7)
    ax.set_axis_off()
    if legend:
        handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#333333") for c in _OP_CLASS_COLOURS.values()]
        ax.legend(handles, list(_OP_CLASS_COLOURS), loc="lower center", fontsize=7,
                  frameon=False, ncol=2)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def _streak(ax, x, y, angle_deg, half_length, *, color, label, marker="o", linestyle="-"):
    """A ball centre and its blur streak (the segment centre +- half_length * (cos, sin) of angle)."""
    t = math.radians(angle_deg)
    dx, dy = half_length * math.cos(t), half_length * math.sin(t)
    ax.plot([x - dx, x + dx], [y - dy, y + dy], color=color, linewidth=1.6, linestyle=linestyle)
    ax.plot([x], [y], marker=marker, markersize=5, markerfacecolor="none", markeredgecolor=color,
            linestyle="none", label=label)


def draw_clip_detection(frame, target, heatmap, label=None, detection=None, *, crop: int | None = 40, axes=None,
                        from_logits: bool = True, titles: Sequence[str] | None = None):
    """Frame, target, heatmap and decoded ball side by side, cropped to ``crop`` px around the true centre."""
    frame, target, heatmap = np.asarray(frame, np.float32), np.asarray(target, np.float32), np.asarray(heatmap, np.float32)
    if axes is None:
        _, axes = plt.subplots(1, 4, figsize=(10, 2.9))
    axes = list(np.ravel(axes))
    heat = 1.0 / (1.0 + np.exp(-np.clip(heatmap, -60, 60))) if from_logits else heatmap
    height, width = target.shape
    if label is not None and crop is not None:
        x0, x1 = max(label.x - crop, -0.5), min(label.x + crop, width - 0.5)
        y0, y1 = max(label.y - crop, -0.5), min(label.y + crop, height - 0.5)
    else:
        x0, x1, y0, y1 = -0.5, width - 0.5, -0.5, height - 0.5
    titles = list(titles) if titles is not None else ["frame", "frame (zoom)", "target", "model heatmap"]
    images = [(frame, {}), (frame, {}), (target, {"cmap": "gray", "vmin": 0, "vmax": 1}),
              (heat, {"cmap": "magma", "vmin": 0, "vmax": 1})]
    for k, (ax, (image, style), title) in enumerate(zip(axes, images, titles)):
        ax.imshow(image, interpolation="nearest", **style)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if k == 0:
            if (x0, x1, y0, y1) != (-0.5, width - 0.5, -0.5, height - 0.5):
                ax.plot([x0, x1, x1, x0, x0], [y0, y0, y1, y1, y0], color="yellow", linewidth=1.0)
            continue
        if label is not None and label.visible:
            _streak(ax, label.x, label.y, label.angle_deg, label.half_length, color="#2ca02c", label="truth",
                    marker="s", linestyle="--")
        if detection is not None:
            _streak(ax, detection.x, detection.y, detection.angle_deg, detection.half_length, color="#d62728",
                    label="decoded")
        ax.set_xlim(x0, x1)
        ax.set_ylim(y1, y0)  # image rows grow downwards
    handles, names = axes[-1].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, names, loc="lower right", fontsize=7, framealpha=0.8)
    return axes


def launch_order(orders: dict[str, list[str]]):
    """One fuse layer's three summands and two launches, one panel per wrapper in its order of launches (appendix).
    Where the generated kernel runs before the in-place oneDNN call it reads *a* without *b*: *b* is crossed out."""
    colours = {"a": "#4c72b0", "b": "#dd8452", "c": "#55a868"}
    fig, axes = plt.subplots(1, len(orders), figsize=(5 * len(orders), 3.6))
    for ax, (title, lines) in zip(np.atleast_1d(axes), orders.items()):
        position = lambda needle: next((i for i, line in enumerate(lines) if needle in line), None)
        k_at, ip_at = position("cpp_fused"), position("_convolution_pointwise_.binary(")
        number = lambda i: "#" + lines[i][1:].split()[0] if i is not None else "?"
        events = sorted([(ip_at if ip_at is not None else 0, "in-place oneDNN call:\na += conv(x)  (adds b)", number(ip_at)),
                         (k_at if k_at is not None else 1, "generated kernel:\nrelu(buffer a + c)", number(k_at))])
        late = (k_at or 0) < (ip_at or 0)
        for row, (_, text, launch) in enumerate([(None, "convolution:\nwrites a", "")] + events):
            y = 2 - row
            ax.add_patch(plt.Rectangle((0.05, y - 0.35), 0.55, 0.7, fill=False, lw=1.2))
            ax.text(0.08, y, f"{launch}  {text}" if launch else text, va="center", fontsize=8)
            if "kernel" in text:
                for j, name in enumerate("abc"):
                    missing = late and name == "b"
                    ax.scatter([0.70 + 0.1 * j], [y], s=260, color=colours[name], alpha=0.3 if missing else 1)
                    ax.text(0.70 + 0.1 * j, y, name, ha="center", va="center", fontsize=8, color="white")
                    if missing:
                        ax.plot([0.77, 0.83], [y - 0.15, y + 0.15], color="#c44e52", lw=2)
        ax.annotate("", xy=(0.02, -0.3), xytext=(0.02, 2.3), arrowprops={"arrowstyle": "->", "color": "grey"})
        ax.set_xlim(0, 1.05), ax.set_ylim(-0.6, 2.6), ax.axis("off")
        ax.set_title(f"{title}: {'b is lost' if late else 'a + b + c'}", fontsize=9)
    fig.tight_layout()
    return fig
