"""Tests of code/gpu_tensorrt.py (run as a subprocess) and graphbook.lab.gpu_runtimes behind it, on a
CPU-only machine: the guard, arguments, the TensorRT build rules (fake tensorrt), streams and
enqueues, the Q/DQ check, the engine cache, and --smoke."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from graphbook import paths
from graphbook.lab import gpu_runtimes
from graphbook.record import results

ROOT = paths.REPO_ROOT
SCRIPT = ROOT / "code" / "gpu_tensorrt.py"


def load_script():
    """The library behind the script: the script itself is only run as a command line."""
    return gpu_runtimes


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only guard")
def test_cpu_machine_exits_3_with_one_line_and_writes_nothing(tmp_path, script, capsys):
    assert script("gpu_tensorrt.py").main(["--results-dir", str(tmp_path)]) == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_tensorrt.py: skipped, nothing measured: ")
    assert "no CUDA device" in lines[0] and list(tmp_path.iterdir()) == []


class FakeTensorRT:
    """Just enough of the tensorrt API to check which build path the script takes."""

    def __init__(self, strongly_typed: bool):
        flags = {"STRONGLY_TYPED": 5} if strongly_typed else {}
        self.NetworkDefinitionCreationFlag = SimpleNamespace(**flags)
        self.BuilderFlag = SimpleNamespace(FP16="FP16", INT8="INT8")
        self.MemoryPoolType = SimpleNamespace(WORKSPACE="WORKSPACE")
        self.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
        self.set_flags, self.network_flags, self.timing_caches_given = [], [], []
        fake = self

        class TimingCache:
            def __init__(self, blob):
                self.blob = blob

            def serialize(self):
                return memoryview(self.blob + b"+tactics")

        class Config:
            def set_memory_pool_limit(self, pool, size):
                pass

            def set_flag(self, flag):
                fake.set_flags.append(flag)

            def create_timing_cache(self, blob):
                fake.timing_caches_given.append(bytes(blob))
                return TimingCache(bytes(blob))

            def set_timing_cache(self, cache, ignore_mismatch):
                self.cache = cache

            def get_timing_cache(self):
                return self.cache

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                fake.network_flags.append(flags)
                return "network"

            def create_builder_config(self):
                return Config()

            def build_serialized_network(self, network, config):
                return SimpleNamespace(nbytes=1234)

        class OnnxParser:
            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                return True

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, plan):
                return "engine"

        self.Builder, self.OnnxParser, self.Runtime = Builder, OnnxParser, Runtime


def test_strongly_typed_build_never_sets_the_removed_fp16_flag(tmp_path):
    script = load_script()
    trt = FakeTensorRT(strongly_typed=True)
    build = script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    assert (build.engine, build.typing, build.plan_bytes) == ("engine", "strong", 1234)
    assert trt.network_flags == [1 << 5]
    assert trt.set_flags == []  # TensorRT 11 has no BuilderFlag.FP16: precision comes from the ONNX types
    assert build.build_s >= 0


def test_old_tensorrt_without_strong_typing_uses_the_builder_flags(tmp_path):
    script = load_script()
    trt = FakeTensorRT(strongly_typed=False)
    assert script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64).typing.startswith("weak")
    script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64, int8=True)
    assert trt.network_flags == [0, 0] and trt.set_flags == ["FP16", "INT8"]


def test_second_build_starts_from_the_first_builds_timing_cache(tmp_path):
    script = load_script()
    trt = FakeTensorRT(strongly_typed=True)
    first = script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    second = script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64, timing_cache=first.timing_cache)
    assert trt.timing_caches_given == [b"", b"+tactics"]   # empty first: a build without a timing cache
    assert not first.with_timing_cache and second.with_timing_cache


def test_parse_failure_is_reported(tmp_path):
    script = load_script()
    trt = FakeTensorRT(strongly_typed=True)

    class FailingParser:
        num_errors = 1

        def __init__(self, network, logger):
            pass

        def parse_from_file(self, path):
            return False

        def get_error(self, index):
            return "unsupported operator Foo"

    trt.OnnxParser = FailingParser
    with pytest.raises(RuntimeError, match="could not parse m.onnx: unsupported operator Foo"):
        script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)


# -- points 5 and 6: the engine runs on a dedicated stream and a failed enqueue raises -------------------

class FakeEngine:
    """A one-input, one-output engine whose context's enqueue returns ``ok``."""

    def __init__(self, trt, ok):
        self.trt, self.ok, self.handles = trt, ok, []
        self.num_io_tensors = 2

    def get_tensor_name(self, i):
        return ["input", "logits"][i]

    def get_tensor_mode(self, name):
        return self.trt.TensorIOMode.INPUT if name == "input" else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return self.trt.DataType.FLOAT

    def get_tensor_shape(self, name):
        return (1, 3, 8, 8) if name == "logits" else (1, 9, 8, 8)

    def create_execution_context(self):
        engine = self

        class Context:
            def set_tensor_address(self, name, pointer):
                pass

            def execute_async_v3(self, handle):
                engine.handles.append(handle)
                return engine.ok

        return Context()


def fake_trt_types():
    return SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="in", OUTPUT="out"),
                           DataType=SimpleNamespace(HALF="half", FLOAT="float"))


def test_failed_enqueue_is_an_error_not_an_empty_call():
    script = load_script()
    trt = fake_trt_types()
    engine = FakeEngine(trt, ok=False)
    run = script.tensorrt_runner(trt, engine, torch.zeros(1, 9, 8, 8), SimpleNamespace(cuda_stream=777), device="cpu")
    with pytest.raises(RuntimeError, match="execute_async_v3 returned False"):
        run()
    assert engine.handles == [777]


def test_engine_runs_on_the_given_stream_never_the_default():
    script = load_script()
    trt = fake_trt_types()
    engine = FakeEngine(trt, ok=True)
    run = script.tensorrt_runner(trt, engine, torch.zeros(1, 9, 8, 8), SimpleNamespace(cuda_stream=31337), device="cpu")
    assert run().shape == (1, 3, 8, 8) and engine.handles == [31337]
    with pytest.raises(ValueError, match="default CUDA stream"):
        script.tensorrt_runner(trt, engine, torch.zeros(1, 9, 8, 8), SimpleNamespace(cuda_stream=0), device="cpu")


def test_onnxruntime_gets_the_stream_as_user_compute_stream():
    script = load_script()
    assert script._ort_stream_options(SimpleNamespace(cuda_stream=0xBEEF)) == {
        "device_id": 0, "user_compute_stream": str(0xBEEF)}
    with pytest.raises(ValueError):
        script._ort_stream_options(SimpleNamespace(cuda_stream=0))  # ONNX Runtime would ignore 0 silently


# -- point 9: the engine cache is per run, and says whether it was built --------------------------------

def test_engine_cache_state(tmp_path):
    script = load_script()
    assert script._engine_cache_state(tmp_path / "absent").startswith("built")
    assert script._engine_cache_state(tmp_path).startswith("built")
    (tmp_path / "TensorrtExecutionProvider_TRTKernel_graph_1.engine").write_bytes(b"x")
    assert script._engine_cache_state(tmp_path) == "loaded from a cache"


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

    script = load_script()
    assert script.tensorrt_qdq_problem(_qdq_model(tmp_path / "sym.onnx", TensorProto.INT8, 0)) is None
    problem = script.tensorrt_qdq_problem(_qdq_model(tmp_path / "asym.onnx", TensorProto.UINT8, 128))
    assert "symmetric INT8" in problem and "2 uint8" in problem


# -- results: kind, columns, and the whole pipeline on the CPU -------------------------------------------

def test_rows_get_every_column_and_the_speedup():
    script = load_script()
    rows = script._finish_rows([dict(script._blank_row("eager_fp32", False), median_ms=10.0),
                               dict(script._blank_row("eager_fp16_half", False), median_ms=4.0, fp16_method="model.half()"),
                               dict(script._blank_row("tensorrt_fp16", False), note="skipped: no tensorrt")])
    assert all(list(r) == script.COLUMNS for r in rows)
    assert [r["speedup_vs_eager"] for r in rows] == [1.0, 2.5, ""]
    assert script.failed_variants(rows) == []
    rows[2]["note"] = "failed: RuntimeError: enqueue"
    assert script.failed_variants(rows) == ["tensorrt_fp16"]


@pytest.mark.slow
def test_smoke_runs_every_step_the_cpu_can(tmp_path):
    work = tmp_path / "work"
    done = run_script("--smoke", "--results-dir", str(tmp_path / "results"), "--workdir", str(work))
    assert done.returncode == 0, done.stderr[-2000:]
    written = list((tmp_path / "results").iterdir())
    assert len(written) == 1 and results.kind("gpu-tensorrt").matches(written[0].name)
    assert written[0].name.startswith("gpu-tensorrt-smoke-cpu-")
    frame = results.load("gpu-tensorrt", tmp_path / "results").set_index("variant")
    assert list(frame.index) == list(load_script().VARIANTS)
    assert frame.loc[["eager_fp32", "eager_fp16_half", "ort_cuda_fp32"], "median_ms"].notna().all()
    assert bool(frame.loc["ort_cuda_fp32", "same_output"]) and frame.smoke.all()
    assert frame.loc["eager_fp16_half", "fp16_method"] == "model.half()"
    assert "symmetric INT8" in frame.loc["tensorrt_int8_qdq", "note"]          # chapter 4's model: uint8
    assert frame.loc["tensorrt_int8_qdq_symmetric", "note"] == "skipped: " + load_script().SMOKE_GPU_ONLY  # compatible
    assert frame.loc["tensorrt_int8_qdq_symmetric", "qdq_source"] == "chapter 4's recipe, int8 symmetric"
    assert not frame.note.fillna("").str.startswith("failed").any()
    runs = [p.name for p in work.iterdir()]
    assert len(runs) == 1 and runs[0].startswith("run-")   # a new folder per run: no engine cache reused
    assert {"blurball_fp32.onnx", "blurball_fp16.onnx", "blurball_int8_qdq.onnx",
            "blurball_int8_qdq_sym.onnx"} <= {p.name for p in (work / runs[0]).iterdir()}


@pytest.mark.slow
def test_smoke_on_a_machine_with_every_gpu_runtime_skips_the_gpu_only_variants(tmp_path):
    """The lab engineer's dry run (README step 2) sees CUDA, ONNX Runtime's GPU providers and TensorRT."""
    script = load_script()
    status = SimpleNamespace(cuda_device="Fake GPU", ort_cuda=True, ort_tensorrt=True, tensorrt=True,
                             tensorrt_version="10.13.0", anything=True)
    args = script.parse_args(["--smoke", "--results-dir", str(tmp_path), "--workdir", str(tmp_path / "w")])
    rows = {r["variant"]: r for r in script.measure(args, status, log=lambda *_: None)}
    assert script.failed_variants(list(rows.values())) == []
    for variant in ("ort_tensorrt_fp16", "tensorrt_fp16", "tensorrt_int8_qdq_symmetric"):
        assert rows[variant]["note"] == "skipped: " + script.SMOKE_GPU_ONLY
    assert rows["ort_cuda_fp32"]["median_ms"] != ""
