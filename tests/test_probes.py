"""Tests of the bandwidth and compute-peak probes (graphbook.measure.probes), at tiny sizes."""
import shutil

import pytest

from graphbook.measure import probes


def test_copy_bandwidth_matmul_peak_and_gemm_rates_count_their_bytes_and_flops():
    result = probes.copy_bandwidth(nbytes=4 * 2 ** 20 + 3, repeats=3)
    assert result["nbytes"] == 4 * 2 ** 20
    assert result["bytes_moved"] == 2 * result["nbytes"]
    expected = result["bytes_moved"] / (result["median_ms"] * 1e-3) / 1e9
    assert result["gb_per_s"] == pytest.approx(expected)
    assert result["gb_per_s"] > 0.1  # any machine moves more than 100 MB/s
    result = probes.matmul_peak(n=128, repeats=3)
    assert result["flops"] == 2 * 128 ** 3
    assert result["gflop_per_s"] == pytest.approx(result["flops"] / (result["median_ms"] * 1e-3) / 1e9)
    assert result["dtype"] == "float32" and result["n"] == 128
    rates = probes.gemm_rates(n=64, threads=1, repeats=1)
    assert [r["library"] for r in rates] == ["PyTorch torch.mm", "NumPy @", "ONNX Runtime MatMul (MLAS)"]
    assert all(r["gflop_per_s"] > 0 for r in rates)
    with pytest.raises(ValueError, match="n must be"):
        probes.gemm_rates(n=0)


@pytest.mark.parametrize("call", [lambda: probes.copy_bandwidth(nbytes=0), lambda: probes.copy_bandwidth(repeats=0)])
def test_probes_reject_bad_sizes(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.slow
def test_measured_clock_is_a_plausible_clock_or_none(monkeypatch):
    ghz = probes.measured_clock_ghz(trials=1, adds=2_000_000)
    assert ghz is None or 0.3 < ghz < 7.0, ghz  # a chain of dependent adds runs at one per cycle
    monkeypatch.setattr(probes, "_CLOCK_CACHE", {})  # the session's clock, read once by conftest, comes back after
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert probes.measured_clock_ghz(trials=1, adds=1000) is None  # no compiler: no clock, never a guess


def test_fp32_and_lower_precision_ceilings_from_the_machines_facts():
    zen4 = {"cpu_microarch": "Zen 4", "cpu_isa": "avx512_vnni", "cpu_ghz": 3.7, "threads": 2}
    ceiling = probes.fp32_ceiling(zen4)
    assert ceiling["gflop_per_s"] == pytest.approx(2 * 32 * 3.7) and "Zen 4" in ceiling["basis"]
    masked = probes.fp32_ceiling({"cpu_microarch": "unknown", "cpu_isa": "amx", "cpu_ghz": 2.7, "threads": 2})
    assert masked["gflop_per_s"] == pytest.approx(2 * 64 * 2.7) and "not identified" in masked["basis"] and "AVX-512" in masked["basis"]
    assert probes.fp32_ceiling({"cpu_microarch": "unknown", "cpu_isa": "unknown", "cpu_ghz": 3.0, "threads": 2})[
        "gflop_per_s"] is None
    assert probes.fp32_ceiling({**zen4, "cpu_ghz": None})["gflop_per_s"] is None
    zen5 = {"cpu_microarch": "Zen 5", "cpu_isa": "avx512_vnni", "cpu_ghz": 3.0, "threads": 2}  # lower precisions:
    fp32 = probes.precision_ceiling(zen5, "fp32")["gflop_per_s"]                               # the instructions it has
    assert fp32 == probes.fp32_ceiling(zen5)["gflop_per_s"] == 384.0
    assert probes.precision_ceiling(zen5, "bf16")["gflop_per_s"] == 2 * fp32
    assert probes.precision_ceiling(zen5, "int8")["gflop_per_s"] == 4 * fp32
    amx = {"cpu_microarch": "unknown", "cpu_isa": "amx", "cpu_ghz": 2.0, "threads": 2}
    assert probes.precision_ceiling(amx, "bf16")["gflop_per_s"] == 2 * 1024 * 2.0
    assert probes.precision_ceiling(amx, "int8")["gflop_per_s"] == 2 * 2048 * 2.0
    unknown = {"cpu_microarch": "unknown", "cpu_isa": "avx2", "cpu_ghz": 3.0, "threads": 2}
    assert probes.precision_ceiling(unknown, "int8")["gflop_per_s"] is None
    with pytest.raises(ValueError, match="fp32, bf16 or int8"):
        probes.precision_ceiling(zen5, "fp16")
