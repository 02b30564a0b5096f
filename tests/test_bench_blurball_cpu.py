"""Tests of code/bench_blurball_cpu.py: arguments, profile grouping, rows, and a tiny eager-only run
(no torch.compile here: compiles take minutes on a shared 2-core machine)."""
import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "code" / "bench_blurball_cpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_blurball_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults(bench):
    args = bench.parse_args([])
    assert args.threads == 2 and (args.height, args.width) == (288, 512)
    assert args.variants == list(bench.VARIANTS)


def test_variant_list_always_includes_the_reference(bench):
    args = bench.parse_args(["--variants", "onnxruntime,compile_default,onnxruntime"])
    assert args.variants == ["eager_fp32", "onnxruntime", "compile_default"]


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--height", "100"], ["--variants", "turbo"],
                                  ["--repeats", "two"], ["--nonsense"]])
def test_bad_arguments_exit_2_with_one_line(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def test_bad_arguments_from_the_command_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--variants", "warp_drive"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown variant" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_op_categories(bench):
    assert bench.op_category("aten::conv2d") == "convolution"
    assert bench.op_category("aten::mkldnn_convolution") == "convolution"
    assert bench.op_category("aten::batch_norm") == "batch_norm"
    for name in ("aten::relu_", "aten::add", "aten::mul", "aten::sigmoid"):
        assert bench.op_category(name) == "elementwise"
    for name in ("aten::mean", "aten::linear", "aten::upsample_nearest2d"):
        assert bench.op_category(name) == "other"


def test_group_profile(bench):
    groups = bench.group_profile([("aten::conv2d", 600.0), ("aten::conv2d", 200.0),
                                  ("aten::batch_norm", 100.0), ("aten::relu_", 50.0), ("aten::mean", 50.0)])
    by = {g["category"]: g for g in groups}
    assert [g["category"] for g in groups] == list(bench.CATEGORIES)
    assert by["convolution"]["ops"] == 2 and by["convolution"]["share"] == pytest.approx(0.8)
    assert by["batch_norm"]["ms"] == pytest.approx(0.1)
    assert sum(g["share"] for g in groups) == pytest.approx(1.0)


def test_variant_rows_ratios_and_peak_share(bench):
    measured = [{"variant": "eager_fp32", "precision": "fp32", "median_ms": 1000.0},
                {"variant": "compile_freezing", "precision": "fp32", "median_ms": 500.0},
                {"variant": "eager_bf16_autocast", "precision": "bf16", "median_ms": 250.0},
                {"variant": "compile_freezing_bf16", "precision": "bf16", "note": "skipped: no bf16"}]
    rows = bench.variant_rows(measured, macs=10 ** 9, peaks={"fp32": 8.0})
    assert rows[0]["speedup_vs_eager_fp32"] == pytest.approx(1.0)
    assert rows[1]["speedup_vs_eager_fp32"] == pytest.approx(2.0)
    assert rows[1]["gflop_per_s"] == pytest.approx(4.0)
    assert rows[1]["share_of_peak"] == pytest.approx(0.5)
    assert rows[2]["share_of_peak"] == ""           # no bf16 peak measured
    assert "median_ms" not in rows[3]


def test_compare_reports_diff_and_peaks(bench):
    import torch

    reference = torch.zeros(1, 3, 4, 4)
    reference[0, :, 1, 1] = 1.0
    same = reference + 1e-6
    moved = reference.clone()
    moved[0, 2, 3, 3] = 2.0
    assert bench.compare(reference, same)["peaks_equal"] is True
    result = bench.compare(reference, moved)
    assert result["peaks_equal"] is False and result["max_abs_diff"] == pytest.approx(2.0)


def test_bf16_support_gives_a_reason(bench):
    supported, reason = bench.bf16_support()
    assert isinstance(supported, bool) and reason


def test_tiny_eager_run_appends_a_new_file(bench, tmp_path, capsys):
    argv = ["--variants", "eager_fp32,eager_fp32_channels_last", "--height", "16", "--width", "32",
            "--repeats", "2", "--warmup", "1", "--threads", "1", "--peak-n", "64",
            "--out-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    assert bench.main(argv + ["--no-profile"]) == 0
    files = sorted(tmp_path.glob("cpu-blurball-*.csv"), key=lambda p: len(p.name))
    assert len(files) == 2 and files[1].stem == files[0].stem + "-2"  # the second run never overwrites
    with files[0].open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    records = [r["record"] for r in rows]
    assert records.count("variant") == 2 and records.count("profile") == 4 and "peak" in records
    variants = {r["variant"]: r for r in rows if r["record"] == "variant"}
    assert variants["eager_fp32_channels_last"]["peaks_equal"] == "True"
    assert float(variants["eager_fp32"]["speedup_vs_eager_fp32"]) == pytest.approx(1.0)
    profile = {r["category"]: int(r["ops"]) for r in rows if r["record"] == "profile"}
    assert profile["convolution"] == 72 and profile["batch_norm"] == 71
    assert rows[0]["threads"] == "1" and rows[0]["torch"]
    assert "wrote" in capsys.readouterr().out
