"""Tests of code/bench_blurball_cpu.py (its main(argv), in this process, never compiling) and of
graphbook.runtimes.profiling."""
import csv

import pytest

from graphbook.measure import probes
from graphbook.runtimes import profiling

TINY = ["--height", "16", "--width", "32", "--repeats", "2", "--warmup", "1", "--threads", "1", "--peak-n", "64",
        "--probe-mib", "4"]


def _event(name, start, end, children=()):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, device_type=SimpleNamespace(name="CPU"), is_user_annotation=False,
                           activity_type="", time_range=SimpleNamespace(start=start, end=end),
                           cpu_children=list(children))


def test_op_units_take_nested_ops_of_one_category_as_one_and_split_off_casts():
    """conv2d under autocast and a slow conv with an inner copy_: one unit each, without the casts and copies."""
    copy = _event("aten::copy_", 2, 4)
    to_copy = _event("aten::_to_copy", 1, 5, [_event("aten::empty_strided", 1, 2), copy])
    mkldnn = _event("aten::mkldnn_convolution", 6, 9)
    conv2d = _event("aten::conv2d", 0, 10, [to_copy, _event("aten::convolution", 5, 10, [mkldnn])])
    slow_copy = _event("aten::copy_", 18, 19)
    slow = _event("aten::conv2d", 10, 20, [_event("aten::_slow_conv2d_forward", 11, 20, [slow_copy])])
    relu = _event("aten::relu", 20, 22, [_event("aten::clamp_min", 20, 21)])
    forward = _event("blurball_forward", 0, 22, [conv2d, slow, relu])
    forward.is_user_annotation = True
    events = [forward, conv2d, to_copy, copy, mkldnn, *conv2d.cpu_children, slow, *slow.cpu_children, slow_copy,
              relu, *relu.cpu_children]
    units = profiling.cpu_op_units(events)
    assert [(u["name"], u["category"], u["us"]) for u in units] == [
        ("aten::conv2d", "convolution", 6), ("aten::_to_copy", "cast/copy", 4),
        ("aten::conv2d", "convolution", 9), ("aten::copy_", "cast/copy", 1), ("aten::relu", "elementwise", 2)]
    by = {g["category"]: g for g in profiling._group_profile((u["name"], u["us"]) for u in units)}
    assert (by["convolution"]["ops"], by["cast/copy"]["ops"], by["elementwise"]["ops"]) == (2, 2, 1)
    groups = profiling._group_profile([("aten::conv2d", 600.0), ("aten::conv2d", 200.0),
                                      ("aten::batch_norm", 100.0), ("aten::relu_", 50.0), ("aten::mean", 50.0)])
    by = {g["category"]: g for g in groups}
    assert [g["category"] for g in groups] == list(profiling.CATEGORIES)
    assert by["convolution"]["ops"] == 2 and by["convolution"]["share"] == pytest.approx(0.8)
    assert by["batch_norm"]["ms"] == pytest.approx(0.1)
    assert sum(g["share"] for g in groups) == pytest.approx(1.0)


def test_rates_take_the_peak_of_each_rows_precision_from_its_own_run():
    import pandas as pd

    per_run = {"run_count": 2, "run_started": "t", "copy_gbps": 9.0}
    frame = pd.DataFrame([
        {"run": 1, "went_first": "eager_fp32", "variant": "eager_fp32", "precision": "fp32", "median_ms": 1000.0,
         "matmul_fp32": 8.0, **per_run},
        {"run": 1, "went_first": "eager_fp32", "variant": "eager_bf16_autocast", "precision": "bf16",
         "median_ms": 250.0, "matmul_fp32": 8.0, **per_run},
        {"run": 1, "went_first": "eager_fp32", "variant": "openvino_bf16", "precision": "bf16", "note": "skipped",
         **per_run},
        {"run": 2, "went_first": "eager_fp32", "variant": "eager_fp32", "precision": "fp32", "median_ms": 500.0,
         "matmul_fp32": 4.0, **per_run}])
    rows = profiling.with_rates(frame, macs=10 ** 9, note="64x64 matmul")
    variants = rows[rows["variant"] == "eager_fp32"].set_index("run")
    assert variants["gflop_per_s"].tolist() == [2.0, 4.0] and variants["share_of_matmul_rate"].tolist() == [0.25, 1.0]
    assert rows[rows["variant"] == "eager_bf16_autocast"]["share_of_matmul_rate"].isna().all()  # no bf16 rate measured
    assert rows[rows["variant"] == "openvino_bf16"]["gflop_per_s"].isna().all()
    peaks = rows[rows["record"] == "peak"]
    assert peaks[["run", "variant", "peak_gflop_per_s"]].values.tolist() == [[1, "matmul_fp32", 8.0],
                                                                            [2, "matmul_fp32", 4.0]]
    assert rows["run"].tolist() == [1, 1, 1, 1, 2, 2] and "matmul_fp32" not in rows


def test_bf16_autocast_weight_casts_are_cast_copy_and_the_profiler_banner_is_silenced(capfd):
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    fp32 = {g["category"]: g["ops"] for g in profiling.profile_eager(model, torch.randn(1, 3, 8, 8))}
    bf16 = {g["category"]: g["ops"] for g in profiling.profile_eager(model, torch.randn(1, 3, 8, 8),
                                                                      autocast_dtype=torch.bfloat16)}
    assert bf16["convolution"] == fp32["convolution"] == 1 and fp32["batch_norm"] == fp32["elementwise"] == 1
    assert bf16["cast/copy"] >= fp32["cast/copy"] + 2  # the weight and bias cast at least, every forward
    supported, reason = probes.bf16_support()
    assert isinstance(supported, bool) and reason
    import os

    with profiling.without_profiler_banner():
        os.write(2, b"USDT: profiler_start\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "after" in err


@pytest.mark.slow
def test_tiny_eager_run_writes_its_runs_profile_and_peaks_into_one_new_file(tmp_path, run_main, monkeypatch):
    # Only channels-last is asked for: eager FP32, the reference, is always added.
    monkeypatch.chdir(tmp_path)
    argv = ["--variants", "eager_fp32_channels_last", *TINY, "--results-dir", str(tmp_path / "results")]
    code, stdout, _ = run_main("bench_blurball_cpu.py", *argv)
    assert code == 0 and "wrote" in stdout
    files = list((tmp_path / "results").glob("cpu-blurball-*.csv"))
    assert len(files) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    with files[0].open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    records = [r["record"] for r in rows]
    # three runs (the default) of both variants, the profile once, the peaks in every run
    assert records.count("variant") == 6 and records.count("profile") == len(profiling.CATEGORIES)
    assert records.count("peak") >= 3
    timed = [r for r in rows if r["record"] == "variant"]
    assert len({r["run_id"] for r in timed}) == 3 and all(r["run_id"].endswith("/r" + r["run"]) for r in timed)
    assert all(float(r["copy_gbps"]) > 0 for r in timed)
    variants = {r["variant"]: r for r in timed}
    assert list(variants) == ["eager_fp32", "eager_fp32_channels_last"]
    assert variants["eager_fp32_channels_last"]["same_peaks"] == "True"
    assert variants["eager_fp32_channels_last"]["same_output"] == "True"
    assert variants["eager_fp32_channels_last"]["expected_to_match_eager"] == "True"
    assert float(variants["eager_fp32"]["speedup_vs_eager"]) == pytest.approx(1.0)
    profile = {r["category"]: int(r["ops"]) for r in rows if r["record"] == "profile"}
    assert profile["convolution"] == 72 and profile["batch_norm"] == 71
    assert rows[0]["threads"] == "1" and rows[0]["torch"]


@pytest.mark.slow
def test_lower_precision_rows_carry_the_decoded_ball_and_what_openvino_ran(tmp_path, run_main, monkeypatch):
    pytest.importorskip("openvino")
    from graphbook.measure import warmup
    from graphbook.model import blurball

    # a stand-in for the trained BlurBall: the rows' protocol is under test (Chapter 5 checks BlurBall's bf16 ball)
    monkeypatch.setattr(blurball, "build_blurball", lambda weights: warmup.tiny_clip_net(hidden=4))
    argv = ["--variants", "eager_bf16_autocast,openvino_fp32", "--height", "32", "--width", "64", "--repeats", "2",
            "--warmup", "1", "--threads", "1", "--peak-n", "64", "--probe-mib", "4", "--ball-clips", "1",
            "--no-profile", "--results-dir", str(tmp_path)]
    code, stdout, _ = run_main("bench_blurball_cpu.py", *argv)
    assert code == 0
    with next(tmp_path.glob("cpu-blurball-*.csv")).open() as handle:
        every = [r for r in csv.DictReader(handle) if r["record"] == "variant"]
    rows = {r["variant"]: r for r in every if r["run"] == "1"}
    assert rows["openvino_fp32"]["weights"] == "trained" and rows["openvino_fp32"]["ball_frames"] == "3"
    assert rows["openvino_fp32"]["same_output"] == "True" and "executed" in rows["openvino_fp32"]["note"]
    line = next(line for line in stdout.splitlines() if line.startswith("lower precision, from these runs:"))
    native_bf16, why = probes.bf16_support()   # False with the instruction set capped to AVX2
    if not native_bf16:   # the variant is a recorded skip with its reason, and nothing lower-precision is decided
        skipped = [r for r in every if r["variant"] == "eager_bf16_autocast"]
        assert skipped and all(r["note"] == f"skipped: {why}" for r in skipped) and "undecided" in line
        return
    bf16 = rows["eager_bf16_autocast"]
    assert bf16["weights"] == "trained" and bf16["ball_frames"] == "3"
    assert bf16["same_ball"] == "True" and bf16["same_output"] == "False"
    # a lower precision is served only when it kept the ball and beats the best FP32 variant of the same runs;
    # the sentence names variants by their labels, never by their IDs
    assert "bf16 autocast" in line and "eager_bf16_autocast" not in line
    assert "serve" in line or "keep FP32" in line
