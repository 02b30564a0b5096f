"""Tests of code/gpu_tensorrt.py (its main(argv) in this process) and graphbook.lab.gpu_runtimes behind it, on a
CPU-only machine: the guard, arguments, the TensorRT build rules (fake tensorrt), streams and
enqueues, the Q/DQ check, the engine cache, and --smoke."""
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

from graphbook.lab import gpu_profiling as gp
from graphbook.lab import gpu_runtimes
from graphbook.record import results
from graphbook.runtimes.onnx_utils import CUDA_PROVIDER, TENSORRT_PROVIDER


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only guard")
def test_cpu_machine_exits_3_with_one_line_and_writes_nothing_but_smokes(tmp_path, script, capsys, monkeypatch):
    assert script("gpu_tensorrt.py").main(["--results-dir", str(tmp_path)]) == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_tensorrt.py: skipped, nothing measured: ")
    assert "no CUDA device" in lines[0] and list(tmp_path.iterdir()) == []
    measured = [dict(gpu_runtimes._blank_row("eager_fp32", True), median_ms=1.0)]
    monkeypatch.setattr(gpu_runtimes, "measure", lambda args, status: measured)  # a smoke run needs no GPU runtime
    assert script("gpu_tensorrt.py").main(["--smoke", "--results-dir", str(tmp_path)]) == 0


def fake_tensorrt(strongly_typed=True, parses=True):
    """Just enough of the tensorrt API (a MagicMock) to check which build path the script takes."""
    trt = MagicMock(NetworkDefinitionCreationFlag=SimpleNamespace(**({"STRONGLY_TYPED": 5} if strongly_typed else {})),
                    BuilderFlag=SimpleNamespace(FP16="FP16", INT8="INT8"))
    builder, parser = trt.Builder.return_value, trt.OnnxParser.return_value
    builder.build_serialized_network.return_value = SimpleNamespace(nbytes=1234)
    config = builder.create_builder_config.return_value
    config.create_timing_cache.side_effect = lambda blob: SimpleNamespace(serialize=lambda: memoryview(blob + b"+tactics"))
    config.get_timing_cache.side_effect = lambda: config.set_timing_cache.call_args.args[0]
    parser.parse_from_file.return_value, parser.num_errors = parses, 1
    parser.get_error.return_value = "unsupported operator Foo"
    trt.Runtime.return_value.deserialize_cuda_engine.return_value = "engine"
    return trt


def calls(method):
    return [c.args[0] for c in method.call_args_list]


@pytest.mark.parametrize("strong, network_flags, builder_flags, typing", [
    (True, [1 << 5] * 2, [], "strong"),   # TensorRT 11 has no BuilderFlag.FP16: precision comes from the ONNX types
    (False, [0, 0], ["FP16", "INT8"], "weak (builder flags)")])   # an old TensorRT without strong typing
def test_the_build_flags_follow_the_installed_tensorrts_typing(tmp_path, strong, network_flags, builder_flags, typing):
    trt = fake_tensorrt(strongly_typed=strong)
    build = gpu_runtimes.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    gpu_runtimes.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64, int8=True)
    assert (build.engine, build.typing, build.plan_bytes) == ("engine", typing, 1234) and build.build_s >= 0
    assert calls(trt.Builder.return_value.create_network) == network_flags
    assert calls(trt.Builder.return_value.create_builder_config.return_value.set_flag) == builder_flags


def test_second_build_starts_from_the_first_builds_timing_cache(tmp_path):
    trt = fake_tensorrt()
    first = gpu_runtimes.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    second = gpu_runtimes.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64, timing_cache=first.timing_cache)
    # empty first: a build without a timing cache
    assert calls(trt.Builder.return_value.create_builder_config.return_value.create_timing_cache) == [b"", b"+tactics"]
    assert not first.with_timing_cache and second.with_timing_cache
    with pytest.raises(RuntimeError, match="could not parse m.onnx: unsupported operator Foo"):
        gpu_runtimes.build_tensorrt_engine(fake_tensorrt(parses=False), tmp_path / "m.onnx", 64)


# -- points 5 and 6: the engine runs on a dedicated stream and a failed enqueue raises -------------------

def fake_engine(trt, ok):
    """A one-input, one-output engine whose context's enqueue returns ``ok``."""
    engine = MagicMock(num_io_tensors=2)
    engine.get_tensor_name.side_effect = ["input", "logits"].__getitem__
    engine.get_tensor_mode.side_effect = lambda name: trt.TensorIOMode.INPUT if name == "input" else "out"
    engine.get_tensor_dtype.return_value = trt.DataType.FLOAT
    engine.get_tensor_shape.side_effect = lambda name: (1, 3, 8, 8) if name == "logits" else (1, 9, 8, 8)
    engine.create_execution_context.return_value.execute_async_v3.return_value = ok
    return engine


def enqueued_handles(engine):
    return calls(engine.create_execution_context.return_value.execute_async_v3)


TRT_TYPES = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="in", OUTPUT="out"),
                            DataType=SimpleNamespace(HALF="half", FLOAT="float"))


def runner(engine, handle):
    return gpu_runtimes.tensorrt_runner(TRT_TYPES, engine, torch.zeros(1, 9, 8, 8), SimpleNamespace(cuda_stream=handle),
                                        device="cpu")


def test_engine_runs_on_the_given_stream_never_the_default_and_a_failed_enqueue_raises():
    engine = fake_engine(TRT_TYPES, ok=True)
    assert runner(engine, 31337)().shape == (1, 3, 8, 8) and enqueued_handles(engine) == [31337]
    with pytest.raises(ValueError, match="default CUDA stream"):
        runner(engine, 0)
    failing = fake_engine(TRT_TYPES, ok=False)
    with pytest.raises(RuntimeError, match="execute_async_v3 returned False"):  # an error, not an empty call
        runner(failing, 777)()
    assert enqueued_handles(failing) == [777]


def test_onnxruntime_gets_the_stream_as_user_compute_stream():
    assert gpu_runtimes._ort_stream_options(SimpleNamespace(cuda_stream=0xBEEF)) == {
        "device_id": 0, "user_compute_stream": str(0xBEEF)}
    with pytest.raises(ValueError):
        gpu_runtimes._ort_stream_options(SimpleNamespace(cuda_stream=0))  # ONNX Runtime would ignore 0 silently


# -- the engine cache is per run, and says whether it was built --------------------------------

def test_engine_cache_state(tmp_path):
    assert gpu_runtimes._engine_cache_state(tmp_path / "absent").startswith("built")
    assert gpu_runtimes._engine_cache_state(tmp_path).startswith("built")
    (tmp_path / "TensorrtExecutionProvider_TRTKernel_graph_1.engine").write_bytes(b"x")
    assert gpu_runtimes._engine_cache_state(tmp_path) == "loaded from a cache"


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


def test_qdq_check_accepts_symmetric_int8_only(tmp_path):
    from onnx import TensorProto

    assert gpu_runtimes.tensorrt_qdq_problem(_qdq_model(tmp_path / "sym.onnx", TensorProto.INT8, 0)) is None
    problem = gpu_runtimes.tensorrt_qdq_problem(_qdq_model(tmp_path / "asym.onnx", TensorProto.UINT8, 128))
    assert "symmetric INT8" in problem and "2 uint8" in problem


# -- results: kind, columns, and the whole pipeline on the CPU -------------------------------------------

def test_rows_get_every_column_and_the_speedup():
    rows = gpu_runtimes._finish_rows([dict(gpu_runtimes._blank_row("eager_fp32", False), median_ms=10.0),
                               dict(gpu_runtimes._blank_row("eager_fp16_half", False), median_ms=4.0, fp16_method="model.half()"),
                               dict(gpu_runtimes._blank_row("tensorrt_fp16", False), note="skipped: no tensorrt")])
    assert all(list(r) == gpu_runtimes.COLUMNS for r in rows)
    assert [r["speedup_vs_eager"] for r in rows] == [1.0, 2.5, ""]
    assert gp.failed_variants(rows) == []
    rows[2]["note"] = "failed: RuntimeError: enqueue"
    assert gp.failed_variants(rows) == ["tensorrt_fp16"]


@pytest.mark.slow
def test_smoke_runs_every_step_the_cpu_can_and_skips_the_gpu_only_variants(tmp_path, run_main, monkeypatch):
    """The lab engineer's dry run (README step 2): a machine with CUDA, ONNX Runtime's GPU providers and TensorRT."""
    every_runtime = gpu_runtimes.GpuRuntimes(cuda_device="Fake GPU", tensorrt_version="10.13.0",
                                             ort_providers=[CUDA_PROVIDER, TENSORRT_PROVIDER])
    monkeypatch.setattr(gpu_runtimes, "detect_gpu_runtimes", lambda: every_runtime)
    work = tmp_path / "work"
    assert run_main("gpu_tensorrt.py", "--smoke", "--results-dir", tmp_path / "results", "--workdir", work)[0] == 0
    written = list((tmp_path / "results").iterdir())
    assert len(written) == 1 and results.kind("gpu-tensorrt").matches(written[0].name)
    assert written[0].name.startswith("gpu-tensorrt-smoke-cpu-")
    frame = results.load("gpu-tensorrt", tmp_path / "results").set_index("variant")
    assert list(frame.index) == list(gpu_runtimes.VARIANTS)
    assert frame.loc[["eager_fp32", "eager_fp16_half", "ort_cuda_fp32"], "median_ms"].notna().all()
    assert bool(frame.loc["ort_cuda_fp32", "same_output"]) and frame.smoke.all()
    assert frame.loc["eager_fp16_half", "fp16_method"] == "model.half()"
    assert "symmetric INT8" in frame.loc["tensorrt_int8_qdq", "note"]          # chapter 4's model: uint8
    for variant in ("ort_tensorrt_fp16", "tensorrt_fp16", "tensorrt_int8_qdq_symmetric"):  # the last is compatible
        assert frame.loc[variant, "note"] == "skipped: " + gpu_runtimes.SMOKE_GPU_ONLY
    assert frame.loc["tensorrt_int8_qdq_symmetric", "qdq_source"] == "chapter 4's recipe, int8 symmetric"
    assert not frame.note.fillna("").str.startswith("failed").any()
    runs = [p.name for p in work.iterdir()]
    assert len(runs) == 1 and runs[0].startswith("run-")   # a new folder per run: no engine cache reused
    assert {"blurball_fp32.onnx", "blurball_fp16.onnx", "blurball_int8_qdq.onnx",
            "blurball_int8_qdq_sym.onnx"} <= {p.name for p in (work / runs[0]).iterdir()}

