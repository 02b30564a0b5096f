"""Tests of code/gpu_tensorrt.py (its main(argv) in this process) and graphbook.lab.gpu_runtimes on a CPU-only
machine, down to --smoke runs whose rows say what was measured, what was skipped and what failed."""
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from graphbook.lab import gpu_runtimes
from graphbook.record import results
from graphbook.runtimes.onnx_utils import CUDA_PROVIDER, TENSORRT_PROVIDER


def smoke_rows(results_dir):
    """The rows of the one gpu-tensorrt file in ``results_dir``."""
    (written,) = results_dir.glob("*.csv")   # its readings sit beside it
    assert results.kind("gpu-tensorrt").matches(written.name) and written.name.startswith("gpu-tensorrt-smoke-cpu-")
    return results.load("gpu-tensorrt", results_dir)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only guard")
def test_cpu_machine_exits_3_with_one_line_and_writes_nothing_but_smokes(tmp_path, run_main):
    code, _, err = run_main("gpu_tensorrt.py", "--results-dir", tmp_path)
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and lines[0].startswith("gpu_tensorrt.py: skipped, nothing measured: ")
    assert "no CUDA device" in lines[0] and list(tmp_path.iterdir()) == []
    # a smoke run needs no GPU runtime
    assert run_main("gpu_tensorrt.py", "--smoke", "--variants", "eager_fp16_half", "--results-dir", tmp_path)[0] == 0
    frame = smoke_rows(tmp_path)
    assert sorted(frame.variant) == ["eager_fp16_half"] * 3 + ["eager_fp32"] * 3  # the reference always runs
    assert frame.median_ms.notna().all() and frame.smoke.all() and (frame.device == "cpu").all()


def test_onnxruntime_gets_the_stream_as_user_compute_stream_and_the_engine_cache_says_if_it_was_built(tmp_path):
    assert gpu_runtimes._ort_stream_options(SimpleNamespace(cuda_stream=0xBEEF)) == {
        "device_id": 0, "user_compute_stream": str(0xBEEF)}
    with pytest.raises(ValueError, match="default CUDA stream"):
        gpu_runtimes._ort_stream_options(SimpleNamespace(cuda_stream=0))  # ONNX Runtime would ignore 0 silently
    assert gpu_runtimes._engine_cache_state(tmp_path / "absent").startswith("built")
    assert gpu_runtimes._engine_cache_state(tmp_path).startswith("built")
    (tmp_path / "TensorrtExecutionProvider_TRTKernel_graph_1.engine").write_bytes(b"x")
    assert gpu_runtimes._engine_cache_state(tmp_path) == "loaded from a cache"
    from onnx import TensorProto

    assert gpu_runtimes.tensorrt_qdq_problem(_qdq_model(tmp_path / "sym.onnx", TensorProto.INT8, 0)) is None
    problem = gpu_runtimes.tensorrt_qdq_problem(_qdq_model(tmp_path / "asym.onnx", TensorProto.UINT8, 128))
    assert "symmetric INT8" in problem and "2 uint8" in problem


# -- TensorRT takes only symmetric INT8 Q/DQ ------------------------------------------------------
def _qdq_model(path, zero_point_type, zero_point):
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
             helper.make_tensor("z", zero_point_type, [], [zero_point])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return path


# -- the whole pipeline on the CPU ------------------------------------------------------------------
@pytest.mark.slow
def test_a_failing_variant_is_a_row_saying_why_and_exit_1(tmp_path, run_main, monkeypatch):
    def enqueue_fails(*args, **kwargs):
        raise RuntimeError("execute_async_v3 returned False: the enqueue failed\nsee the log")
    monkeypatch.setattr(gpu_runtimes, "_ort_runner", enqueue_fails)
    code, _, err = run_main("gpu_tensorrt.py", "--smoke", "--variants", "ort_cuda_fp32", "--results-dir", tmp_path)
    assert code == 1 and err.strip().splitlines()[-1].endswith("against eager: ort_cuda_fp32")
    frame = smoke_rows(tmp_path).set_index("variant")
    assert frame.loc["eager_fp32", "median_ms"].notna().all()  # what worked is recorded all the same
    assert frame.loc["ort_cuda_fp32", "median_ms"].isna().all()
    assert set(frame.loc["ort_cuda_fp32", "note"]) == {
        "skipped: failed: RuntimeError: execute_async_v3 returned False: the enqueue failed"}


@pytest.mark.slow
def test_smoke_runs_every_step_the_cpu_can_and_skips_the_gpu_only_variants(tmp_path, run_main, monkeypatch):
    """The lab engineer's dry run (README step 2): a machine with CUDA, ONNX Runtime's GPU providers and TensorRT."""
    every_runtime = gpu_runtimes.GpuRuntimes(cuda_device="Fake GPU", tensorrt_version="10.13.0",
                                             ort_providers=[CUDA_PROVIDER, TENSORRT_PROVIDER])
    monkeypatch.setattr(gpu_runtimes, "detect_gpu_runtimes", lambda: every_runtime)
    work = tmp_path / "work"
    assert run_main("gpu_tensorrt.py", "--smoke", "--results-dir", tmp_path / "results", "--workdir", work)[0] == 0
    frame = smoke_rows(tmp_path / "results")
    assert frame.groupby("run").size().tolist() == [len(gpu_runtimes.VARIANTS)] * 3 and frame.run_id.nunique() == 3
    one = frame[frame.run == 1].set_index("variant")
    assert list(one.index) == list(gpu_runtimes.VARIANTS)
    measured = one.loc[["eager_fp32", "eager_fp16_half", "ort_cuda_fp32"]]
    assert measured.median_ms.notna().all() and measured.speedup_vs_eager.notna().all()
    assert one.loc["eager_fp32", "speedup_vs_eager"] == 1.0
    assert bool(one.loc["ort_cuda_fp32", "same_output"]) and frame.smoke.all()
    assert one.loc["eager_fp16_half", "fp16_method"] == "model.half()"
    assert "symmetric INT8" in one.loc["tensorrt_int8_qdq", "note"]          # chapter 4's model: uint8
    for variant in ("ort_tensorrt_fp16", "tensorrt_fp16", "tensorrt_int8_qdq_symmetric"):  # the last is compatible
        assert one.loc[variant, "note"] == "skipped: " + gpu_runtimes.SMOKE_GPU_ONLY
        assert pd.isna(one.loc[variant, "median_ms"])
    assert one.loc["tensorrt_int8_qdq_symmetric", "qdq_source"] == "chapter 4's recipe, int8 symmetric"
    assert not frame.note.fillna("").str.contains("failed").any()
    runs = [p.name for p in work.iterdir()]
    assert len(runs) == 1 and runs[0].startswith("run-")   # a new folder per run: no engine cache reused
    assert {"blurball_fp32.onnx", "blurball_fp16.onnx", "blurball_int8_qdq.onnx",
            "blurball_int8_qdq_sym.onnx"} <= {p.name for p in (work / runs[0]).iterdir()}
