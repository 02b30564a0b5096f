"""Tests of the plotting helpers (graphbook.plots)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from graphbook import plots  # noqa: E402


def test_roofline_attainable_has_two_regimes():
    # ridge at 100 / 10 = 10 FLOP/byte
    assert plots.roofline_attainable(1.0, 100.0, 10.0) == 10.0
    assert plots.roofline_attainable(1000.0, 100.0, 10.0) == 100.0
    assert np.allclose(plots.roofline_attainable([0.5, 10, 20], 100.0, 10.0), [5, 100, 100])
    with pytest.raises(ValueError):
        plots.roofline_attainable(1.0, 0.0, 10.0)


def test_roofline_draws_points():
    fig, ax = plt.subplots()
    plots.roofline(100.0, 10.0, [("relu", 0.125), ("matmul", 50.0, 60.0)], ax=ax)
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 4  # roof, ridge, two points
    with pytest.raises(ValueError):
        plots.roofline(100.0, 10.0, [("bad",)], ax=ax)
    plt.close(fig)


def test_bar_with_spread_checks_inputs():
    fig, ax = plt.subplots()
    plots.bar_with_spread(["a", "b"], [2.0, 3.0], [1.0, 2.5], [2.5, 4.0], ax=ax)
    assert len(ax.patches) == 2
    with pytest.raises(ValueError):
        plots.bar_with_spread(["a"], [1.0, 2.0], ax=ax)
    with pytest.raises(ValueError):
        plots.bar_with_spread(["a"], [1.0], [2.0], [3.0], ax=ax)
    with pytest.raises(ValueError):
        plots.bar_with_spread(["a"], [1.0], [0.5], None, ax=ax)
    plt.close(fig)
