"""Tests of code/gpu_blurball.py (its main(argv) in this process) and graphbook.lab.gpu_measure behind it, on a CPU:
arguments, the plan, the no-CUDA exit, the rows and file names, the cuDNN-benchmark child process,
and the whole pipeline in --smoke mode."""
import pytest
import torch

from graphbook import paths
from graphbook.lab import gpu_measure as gpu
from graphbook.lab import gpu_profiling as gp
from graphbook.record import results

SCRIPT = paths.REPO_ROOT / "code" / "gpu_blurball.py"


def test_defaults_follow_the_article():
    args = gpu.parse_args([])
    assert (args.repeats, args.warmup) == (50, 20)
    assert not args.skip_max_autotune and not args.no_profile and args.results_dir == paths.RESULTS_DIR
    assert not args.smoke
    with pytest.raises(SystemExit):  # smoke rows must never reach the book's results
        gpu.parse_args(["--smoke", "--results-dir", str(paths.DATA_DIR / "results")])


def test_plan_covers_the_article_matrix_with_cudnn_benchmark_in_a_child_process():
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
    assert {c["variant"] for c in plan if c["process"] == "child"} == {
        "fp32_eager_nchw+cudnn_benchmark", "fp16_eager_nchw+cudnn_benchmark"}
    assert all(c["cudnn_benchmark"] == (c["process"] == "child") for c in plan)


def test_child_sets_the_flag_before_any_convolution(monkeypatch, tmp_path, capsys):
    flag_when_model_built = []

    def fake_load(smoke, device, weights):
        flag_when_model_built.append(torch.backends.cudnn.benchmark)
        raise SystemExit(0)  # stop here: the point is the order

    monkeypatch.setattr(gp, "model_and_input", fake_load)
    previous = torch.backends.cudnn.benchmark
    try:
        args = gpu.parse_args(["--smoke", "--cudnn-benchmark-child", str(tmp_path / "ref.pt")])
        with pytest.raises(SystemExit):
            gpu.run_cudnn_benchmark_child(args)
    finally:
        torch.backends.cudnn.benchmark = previous
    assert flag_when_model_built == [True]


def test_child_command_line(tmp_path):
    args = gpu.parse_args(["--smoke", "--results-dir", str(tmp_path), "--warm-cache"])
    argv = gpu._child_argv(args, tmp_path / "ref.pt")
    assert argv[0] == str(SCRIPT) == str(gpu.SCRIPT) and "--cudnn-benchmark-child" in argv and "--smoke" in argv
    assert "--warm-cache" in argv and "--results-dir" not in argv  # the child writes nothing


# -- exits ----------------------------------------------------------------------------------------

def test_no_cuda_exits_3_with_a_clear_line(tmp_path, script, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert script("gpu_blurball.py").main(["--skip-max-autotune", "--results-dir", str(tmp_path)]) == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "no GPU measurement" in err
    assert list(tmp_path.iterdir()) == []


# -- rows and files (the file pattern) ------------------------------------------------------

def _fake_measurements():
    times = {"fp32_eager_nchw": 15.0, "fp16_eager_nchw": 10.0, "fp16_compile_default_nchw": 5.0}
    out = []
    for config in gpu.plan_matrix(skip_max_autotune=True):
        entry = dict(config, note="", expected_to_match_eager=config["precision"] == "fp32")
        if config["variant"] in times:
            entry.update(median_ms=times[config["variant"]], min_ms=1, max_ms=2, q1_ms=1, q3_ms=2,
                         repeats=50, warmup=20, compile_s=0.0, max_abs_diff=0.0, same_output=True,
                         same_peaks=True)
        else:
            entry["note"] = "failed: not measured in this fake"
        out.append(entry)
    return out


def test_rows_have_the_schema_and_ratios():
    profile = gp._summarize_kernels([("aten::convolution", "c", 0, 10)], wall_ms=0.02)
    rows = gpu._build_rows(_fake_measurements(), {"fp32_eager_nchw": profile})
    assert all(list(r) == gpu.CSV_COLUMNS for r in rows)
    by_name = {r["variant"]: r for r in rows if r["record"] == "variant"}
    assert by_name["fp32_eager_nchw"]["speedup_vs_eager"] == pytest.approx(1.0)
    assert by_name["fp16_eager_nchw"]["speedup_vs_eager"] == pytest.approx(1.5)
    assert by_name["fp16_compile_default_nchw"]["speedup_vs_eager_same_precision"] == pytest.approx(2.0)
    assert by_name["fp16_compile_default_nchw"]["speedup_vs_eager"] == pytest.approx(3.0)
    assert by_name["fp32_compile_default_nchw"]["median_ms"] == ""
    assert by_name["fp16_eager_nchw"]["fp16_method"] == "autocast"
    profile_rows = [r for r in rows if r["record"] == "profile"]
    assert len(profile_rows) == len(gp.CATEGORIES) and profile_rows[0]["precision"] == "fp32"
    assert "fp16_compile_default_nchw" in gpu.format_table(rows)
    assert "fp32_compile_default_nchw" in gp.failed_variants(rows)


def test_results_are_a_gpu_blurball_file_named_by_the_gpu(tmp_path):
    rows = gpu._build_rows(_fake_measurements(), {})
    env = {"date": "2026-01-01T00:00:00+00:00", "gpu_name": "Fake GPU", "torch": "2.11.0"}
    path = gp.write_results(gpu.KIND, rows, env, tmp_path, "Fake GPU 8GB")
    assert path.name == "gpu-blurball-fake-gpu-8gb-2026-01-01.csv"
    loaded = results.load("gpu-blurball", tmp_path)
    assert len(loaded) == len(rows) and (loaded.gpu_name == "Fake GPU").all()


# -- the whole pipeline on the CPU ------------------------------------------------------------------

@pytest.mark.slow
def test_smoke_runs_every_step_on_the_cpu(tmp_path, run_main):
    code, _, err = run_main("gpu_blurball.py", "--smoke", "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"gpu-blurball-smoke-cpu-{files[0].name[-14:-4]}.csv"]
    frame = results.load("gpu-blurball", tmp_path)
    variants = frame[frame.record == "variant"].set_index("variant")
    assert len(variants) == 12 and variants.median_ms.notna().all()
    assert not variants.note.fillna("").str.startswith("failed").any()
    assert frame.smoke.all() and (frame.device == "cpu").all()
    # cuDNN benchmark rows came from the child process, on the same weights
    child = variants[variants.process == "child"]
    assert len(child) == 2 and child.same_peaks.all()
    assert bool(variants.loc["fp32_eager_nchw+cudnn_benchmark", "same_output"])
    # CUDA-graph modes time a second call; the others do not
    assert variants.loc[["fp32_compile_reduce_overhead_nchw", "fp16_compile_max_autotune_nchw"], "second_call_s"].notna().all()
    assert variants.loc[["fp32_compile_default_nchw", "fp32_eager_nchw"], "second_call_s"].isna().all()
    assert (variants.loc[variants.precision == "fp16", "fp16_method"] == "autocast").all()
    profiles = frame[frame.record == "profile"]
    assert set(profiles.variant) == {"fp32_eager_nchw", "fp16_eager_nchw", "fp16_compile_default_nchw"}
    fp16_eager = profiles[profiles.variant == "fp16_eager_nchw"].set_index("category")
    assert fp16_eager.loc["cast/copy", "kernels"] >= 3 and fp16_eager.loc["convolution", "kernels"] >= 1
    for column in ("git_commit", "torch", "cpu_model", "weights", "date"):
        assert frame[column].notna().all()
