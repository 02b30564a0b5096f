"""Tests of the plotting helpers (graphbook.teach.plots)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from graphbook.teach import plots  # noqa: E402


def test_roofline_has_two_regimes_and_draws_points_and_a_flow_diagram_every_box():
    # ridge at 100 / 10 = 10 FLOP/byte
    assert plots._roofline_attainable(1.0, 100.0, 10.0) == 10.0
    assert plots._roofline_attainable(1000.0, 100.0, 10.0) == 100.0
    assert np.allclose(plots._roofline_attainable([0.5, 10, 20], 100.0, 10.0), [5, 100, 100])
    fig, ax = plt.subplots()
    plots.roofline(100.0, 10.0, [("relu", 0.125), ("matmul", 50.0, 60.0)], ax=ax)
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 4  # roof, ridge, two points
    plt.close(fig)
    ax = plots.flow_diagram({"a": (0, 0, "bytecode"), "b": (3, 0, "FX graph", "#fde")}, [("a", "b", "Dynamo")])
    assert [t.get_text() for t in ax.texts if t.get_text()] == ["bytecode", "FX graph", "Dynamo"]
    assert len(ax.patches) == 2
    with pytest.raises(KeyError, match="not drawn"):
        plots.flow_diagram({"a": (0, 0, "x")}, [("a", "z")])


@pytest.mark.slow
def test_draw_fusion_groups_boxes_every_group_and_colours_every_class():
    import torch
    from torch import nn

    from graphbook.teach import fusion_rules

    class ConvBnReluAdd(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x))) + x

    gm = fusion_rules.capture_aten_graph(ConvBnReluAdd().eval(), (torch.randn(1, 4, 6, 6),))
    groups = fusion_rules.fuse_groups(gm)
    ax = plots.draw_fusion_groups(gm, groups, title="block")
    assert ax.get_title() == "block"
    assert sum(t.get_text().startswith("group ") for t in ax.texts) == len(groups)
    plots.draw_fusion_groups(gm, legend=False)  # groups default to fuse_groups(gm)
    assert set(plots._OP_CLASS_COLOURS) == {c.value for c in fusion_rules.OpClass}
    plt.close("all")


def test_draw_clip_detection_draws_truth_and_detection_on_four_panels():
    from graphbook.model import decoding, synthetic_clips

    clip = synthetic_clips._make_clip(3, 48, 64, p_no_ball=0.0, p_hidden_frame=0.0)
    label = clip.labels[1]
    logits = np.where(clip.targets[1] > 0, 8.0, -8.0).astype(np.float32)  # a perfect heatmap, as logits
    best = decoding._decode_heatmap(logits).best
    assert best is not None and np.hypot(best.x - label.x, best.y - label.y) < 1.5
    fig, axes = plt.subplots(1, 4)
    out = plots.draw_clip_detection(clip.frames[1], clip.targets[1], logits, label, best, crop=12, axes=axes)
    assert len(out) == 4 and [a.get_title() for a in out] == ["frame", "frame (zoom)", "target", "model heatmap"]
    assert len(out[0].lines) == 1                       # the box around the ball on the whole frame
    assert all(len(a.lines) == 4 for a in out[1:])      # truth streak + centre, decoded streak + centre
    x0, x1 = out[1].get_xlim()
    assert x0 <= label.x <= x1 and x1 - x0 <= 24 + 1e-6  # cropped around the true centre
    assert out[3].get_legend() is not None
    plt.close(fig)
    # no label, no detection: the whole image, no marks
    out = plots.draw_clip_detection(clip.frames[1], clip.targets[1], logits, crop=None)
    assert all(len(a.lines) == 0 for a in out) and out[1].get_xlim() == (-0.5, 63.5)
    plt.close("all")
