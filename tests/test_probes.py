"""Tests of the bandwidth and compute-peak probes (graphbook.probes), at tiny sizes."""
import pytest

from graphbook import probes


def test_copy_bandwidth_counts_read_and_write():
    result = probes.copy_bandwidth(nbytes=4 * 2 ** 20, repeats=3, warmup=1)
    assert result["nbytes"] == 4 * 2 ** 20
    assert result["bytes_moved"] == 2 * result["nbytes"]
    expected = result["bytes_moved"] / (result["median_ms"] * 1e-3) / 1e9
    assert result["gb_per_s"] == pytest.approx(expected)
    assert result["gb_per_s"] > 0.1  # any machine moves more than 100 MB/s


def test_copy_bandwidth_rounds_to_whole_floats():
    assert probes.copy_bandwidth(nbytes=4099, repeats=1, warmup=0)["nbytes"] == 4096


def test_matmul_peak_counts_two_n_cubed():
    result = probes.matmul_peak(n=128, repeats=3, warmup=1)
    assert result["flops"] == 2 * 128 ** 3
    assert result["gflop_per_s"] == pytest.approx(result["flops"] / (result["median_ms"] * 1e-3) / 1e9)
    assert result["dtype"] == "float32" and result["n"] == 128


@pytest.mark.parametrize("call", [
    lambda: probes.copy_bandwidth(nbytes=0), lambda: probes.copy_bandwidth(repeats=0),
    lambda: probes.matmul_peak(n=0), lambda: probes.matmul_peak(n=64, repeats=-1)])
def test_probes_reject_bad_sizes(call):
    with pytest.raises(ValueError):
        call()
