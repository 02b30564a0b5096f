"""Tests of code/gpu_blurball.py (its main(argv) in this process) and graphbook.lab.gpu_measure on a CPU, down to
the whole pipeline in --smoke mode with one mode failing."""
import pandas as pd
import pytest
import torch

from graphbook import paths
from graphbook.lab import gpu_measure as gpu
from graphbook.lab import gpu_profiling as gp
from graphbook.record import results

SCRIPT = paths.REPO_ROOT / "code" / "gpu_blurball.py"


def test_defaults_and_plan_cover_the_article_matrix_with_cudnn_benchmark_in_a_child_process():
    args = gpu.parse_args([])
    assert (args.repeats, args.warmup) == (50, 20)
    assert not args.skip_max_autotune and not args.no_profile and args.results_dir == paths.RESULTS_DIR
    assert not args.smoke
    with pytest.raises(SystemExit):  # smoke rows must never reach the book's results
        gpu.parse_args(["--smoke", "--results-dir", str(paths.DATA_DIR / "results")])
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


def test_child_sets_the_flag_before_any_convolution_and_writes_nothing(monkeypatch, tmp_path, capsys):
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
    args = gpu.parse_args(["--smoke", "--results-dir", str(tmp_path), "--warm-cache"])
    argv = gpu._child_argv(args, tmp_path / "ref.pt")
    assert argv[0] == str(SCRIPT) == str(gpu.SCRIPT) and "--cudnn-benchmark-child" in argv and "--smoke" in argv
    assert "--warm-cache" in argv and "--results-dir" not in argv  # the child writes nothing


# -- exits ----------------------------------------------------------------------------------------
def test_results_are_a_file_named_by_the_gpu_and_without_cuda_the_script_exits_3(tmp_path, script, capsys):
    if not torch.cuda.is_available():
        assert script("gpu_blurball.py").main(["--skip-max-autotune", "--results-dir", str(tmp_path)]) == 3
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and "no GPU measurement" in err
        assert list(tmp_path.iterdir()) == []
    frame = pd.DataFrame([{"record": "variant", "variant": "fp32_eager_nchw", "run": run, "median_ms": 15.0}
                          for run in (1, 2, 3)])
    env = {"date": "2026-01-01T00:00:00+00:00", "gpu_name": "Fake GPU", "torch": "2.11.0"}
    path = gp.write_results(gpu.KIND, frame, env, tmp_path, "Fake GPU 8GB")
    assert path.name == "gpu-blurball-fake-gpu-8gb-2026-01-01.csv"
    loaded = results.load("gpu-blurball", tmp_path)
    assert len(loaded) == 3 and (loaded.gpu_name == "Fake GPU").all() and loaded.run_id.nunique() == 3


# -- the whole pipeline on the CPU ------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_runs_every_step_on_the_cpu_and_a_failing_mode_loses_no_other_row(tmp_path, run_main, monkeypatch):
    build_call = gpu._build_call

    def fp32_max_autotune_fails(config, *args, **kwargs):
        if config["variant"] == "fp32_compile_max_autotune_nchw":
            raise RuntimeError("no Triton for this GPU\nsecond line")
        return build_call(config, *args, **kwargs)
    monkeypatch.setattr(gpu, "_build_call", fp32_max_autotune_fails)
    code, _, err = run_main("gpu_blurball.py", "--smoke", "--results-dir", tmp_path)
    assert code == 1 and "fp32_compile_max_autotune_nchw" in err.strip().splitlines()[-1], err[-2000:]
    (written,) = tmp_path.glob("*.csv")   # its readings sit beside it
    assert written.name == f"gpu-blurball-smoke-cpu-{written.name[-14:-4]}.csv"
    assert sorted(p.name for p in tmp_path.iterdir()) == [written.name, written.stem + results.RAW_TIMES_SUFFIX]
    frame = results.load("gpu-blurball", tmp_path)
    rows = frame[frame.record == "variant"]
    assert rows.groupby("run").size().tolist() == [12, 12, 12] and rows.run_id.nunique() == 3
    failed = rows[rows.variant == "fp32_compile_max_autotune_nchw"]
    assert failed.median_ms.isna().all()
    assert (failed.note == "skipped: failed: RuntimeError: no Triton for this GPU").all()  # its first line
    variants = rows[rows.run == 1].set_index("variant").drop("fp32_compile_max_autotune_nchw")
    assert len(variants) == 11 and variants.median_ms.notna().all() and variants.note.isna().all()
    assert frame.smoke.all() and (frame.device == "cpu").all()
    # cuDNN benchmark rows came from the child process, on the same weights, in the same three runs
    child = variants[variants.process == "child"]
    assert len(child) == 2 and child.same_peaks.all()
    assert bool(variants.loc["fp32_eager_nchw+cudnn_benchmark", "same_output"])
    # CUDA-graph modes time a second call; the others do not
    assert variants.loc[["fp32_compile_reduce_overhead_nchw", "fp16_compile_max_autotune_nchw"], "second_call_s"].notna().all()
    assert variants.loc[["fp32_compile_default_nchw", "fp32_eager_nchw"], "second_call_s"].isna().all()
    assert (variants.loc[variants.precision == "fp16", "fp16_method"] == "autocast").all()
    assert variants.loc[variants.precision == "fp32", "fp16_method"].isna().all()  # missing is empty, never ""
    # speed-ups over the same run's eager NCHW: in FP32, and in the variant's own precision
    eager = variants.median_ms[["fp32_eager_nchw", "fp16_eager_nchw"]]
    assert variants.speedup_vs_eager.to_numpy() == pytest.approx(eager.iloc[0] / variants.median_ms.to_numpy())
    fp16 = variants[variants.precision == "fp16"]
    assert fp16.speedup_vs_eager_same_precision.to_numpy() == pytest.approx(eager.iloc[1] / fp16.median_ms.to_numpy())
    profiles = frame[frame.record == "profile"]
    assert set(profiles.variant) == {"fp32_eager_nchw", "fp16_eager_nchw", "fp16_compile_default_nchw"}
    assert profiles.run.isna().all() and frame.index[frame.record == "profile"].max() < rows.index.min()
    fp16_eager = profiles[profiles.variant == "fp16_eager_nchw"].set_index("category")
    assert fp16_eager.loc["cast/copy", "kernels"] >= 3 and fp16_eager.loc["convolution", "kernels"] >= 1
    for column in ("git_commit", "torch", "cpu_model", "weights", "date"):
        assert frame[column].notna().all()
