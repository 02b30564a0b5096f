"""Tests of code/gpu_blurball.py that run on a CPU: arguments, the plan, the no-CUDA exit, the
kernel grouping and the CSV rows (built from fake measurements)."""
import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "code" / "gpu_blurball.py"


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("gpu_blurball", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_follow_the_article(gpu):
    args = gpu.parse_args([])
    assert (args.repeats, args.warmup) == (50, 20)
    assert not args.skip_max_autotune and not args.no_profile and args.out_dir is None


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--warmup", "x"], ["--bogus"]])
def test_bad_arguments_exit_2_with_one_line(gpu, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err


def test_plan_covers_the_article_matrix(gpu):
    plan = gpu.plan_matrix()
    names = [c["variant"] for c in plan]
    assert len(names) == len(set(names)) == 12
    for precision in ("fp32", "fp16"):
        assert f"{precision}_eager_nchw" in names
        assert f"{precision}_eager_channels_last" in names
        assert f"{precision}_eager_nchw+cudnn_benchmark" in names
        for mode in ("compile_default", "compile_reduce_overhead", "compile_max_autotune"):
            assert f"{precision}_{mode}_nchw" in names
    assert plan[0]["variant"] == "fp32_eager_nchw"
    assert all(c["mode"] == "compile_max_autotune" for c in plan[-2:])  # slowest compile last
    short = gpu.plan_matrix(skip_max_autotune=True)
    assert len(short) == 10 and not any("max_autotune" in c["variant"] for c in short)


def test_no_cuda_exits_3_with_a_clear_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--skip-max-autotune"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU measurement" in lines[0] and "Traceback" not in proc.stderr


def test_bad_arguments_exit_2_from_the_command_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "-1"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_device_slug(gpu):
    assert gpu.device_slug("NVIDIA GeForce RTX 4060 Laptop GPU") == "nvidia-geforce-rtx-4060-laptop-gpu"
    assert gpu.device_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu.device_slug("///") == "unknown-gpu"


def test_kernel_categories(gpu):
    assert gpu.kernel_category("aten::cudnn_convolution", "sm80_xmma_fprop_implicit_gemm") == "convolution"
    assert gpu.kernel_category("aten::batch_norm", "bn_fw_inf_1C11_kernel_NCHW") == "batch_norm"
    assert gpu.kernel_category("aten::relu_", "vectorized_elementwise_kernel") == "other"
    assert gpu.kernel_category("", "implicit_convolve_sgemm") == "convolution"
    assert gpu.kernel_category("", "bn_fw_tr_1C11_kernel") == "batch_norm"


def test_union_length_counts_overlaps_once(gpu):
    assert gpu.union_length([]) == 0
    assert gpu.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert gpu.union_length([(5, 6), (0, 10)]) == 10


def test_summarize_kernels(gpu):
    kernels = [("aten::convolution", "conv_a", 0, 1000), ("aten::convolution", "conv_b", 1000, 3000),
               ("aten::batch_norm", "bn", 3000, 3500), ("aten::relu_", "relu", 3500, 4000),
               ("aten::add", "add", 3600, 3700)]  # overlaps relu: active time counts it once
    rows = {r["category"]: r for r in gpu.summarize_kernels(kernels, wall_ms=4.5)}
    assert rows["convolution"]["kernels"] == 2 and rows["convolution"]["kernel_ms"] == pytest.approx(3.0)
    assert rows["batch_norm"]["kernels"] == 1 and rows["other"]["kernels"] == 2
    assert sum(r["share"] for r in rows.values()) == pytest.approx(1.0)
    assert rows["other"]["total_kernels"] == 5
    assert rows["other"]["active_gpu_ms"] == pytest.approx(4.0)
    assert rows["other"]["wall_ms"] == 4.5


def _fake_measurements(gpu):
    times = {"fp32_eager_nchw": 15.0, "fp16_eager_nchw": 10.0, "fp16_compile_default_nchw": 5.0}
    out = []
    for config in gpu.plan_matrix(skip_max_autotune=True):
        entry = dict(config, note="")
        if config["variant"] in times:
            entry.update(median_ms=times[config["variant"]], min_ms=1, max_ms=2, q1_ms=1, q3_ms=2,
                         repeats=50, warmup=20, first_call_s=0.0, max_abs_diff=0.0, peaks_equal=True)
        else:
            entry["note"] = "failed: not measured in this fake"
        out.append(entry)
    return out


def test_rows_have_the_schema_and_ratios(gpu):
    profile = gpu.summarize_kernels([("aten::convolution", "c", 0, 10)], wall_ms=0.02)
    rows = gpu.build_rows(_fake_measurements(gpu), {"fp32_eager_nchw": profile})
    assert all(list(r) == gpu.CSV_COLUMNS for r in rows)
    by_name = {r["variant"]: r for r in rows if r["record"] == "variant"}
    assert by_name["fp32_eager_nchw"]["speedup_vs_eager_fp32"] == pytest.approx(1.0)
    assert by_name["fp16_eager_nchw"]["speedup_vs_eager_fp32"] == pytest.approx(1.5)
    assert by_name["fp16_compile_default_nchw"]["speedup_vs_eager_same_precision"] == pytest.approx(2.0)
    assert by_name["fp16_compile_default_nchw"]["speedup_vs_eager_fp32"] == pytest.approx(3.0)
    assert by_name["fp32_compile_default_nchw"]["median_ms"] == ""
    profile_rows = [r for r in rows if r["record"] == "profile"]
    assert len(profile_rows) == 3 and profile_rows[0]["precision"] == "fp32"
    assert "fp16_compile_default_nchw" in gpu.format_table(rows)


def test_write_results_never_overwrites(gpu, tmp_path):
    rows = gpu.build_rows(_fake_measurements(gpu), {})
    env = {"date": "2026-01-01T00:00:00+00:00", "gpu_name": "Fake GPU", "torch": "2.11.0"}
    first = gpu.write_results(rows, env, tmp_path, "Fake GPU 8GB", date="2026-01-01")
    second = gpu.write_results(rows, env, tmp_path, "Fake GPU 8GB", date="2026-01-01")
    assert first.name == "gpu-fake-gpu-8gb-2026-01-01.csv"
    assert second.name == "gpu-fake-gpu-8gb-2026-01-01-2.csv"
    with first.open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows)
    assert list(table[0]) == gpu.CSV_COLUMNS + ["date", "gpu_name", "torch"]
    assert table[0]["gpu_name"] == "Fake GPU"
