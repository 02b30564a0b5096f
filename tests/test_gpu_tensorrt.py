"""Tests of code/gpu_tensorrt.py that run on a CPU-only machine: the guard, arguments, the TensorRT build rules."""
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "code" / "gpu_tensorrt.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_tensorrt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only guard")
def test_cpu_machine_exits_with_one_line_and_writes_nothing(tmp_path):
    done = run_script("--out-dir", str(tmp_path))
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_tensorrt.py: skipped, nothing measured: ")
    assert "no CUDA device" in lines[0]
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--variants", "bogus"], ["--repeats", "0"], ["--warmup", "x"],
                                  ["--no-such-option"]])
def test_bad_arguments_exit_2_with_one_line(args):
    done = run_script(*args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_variant_list_parses_subsets():
    script = load_script()
    assert script.parse_args(["--variants", "eager_fp32,tensorrt_fp16"]).variants == ["eager_fp32", "tensorrt_fp16"]
    assert script.parse_args([]).variants == list(script.VARIANTS)


def test_device_slug():
    script = load_script()
    assert script.device_slug("NVIDIA H200") == "nvidia-h200"
    assert script.device_slug("NVIDIA GeForce RTX 4060 Laptop GPU") == "nvidia-geforce-rtx-4060-laptop-gpu"
    assert script.device_slug("") == "unknown-gpu"


class FakeTensorRT:
    """Just enough of the tensorrt API to check which build path the script takes."""

    def __init__(self, strongly_typed: bool):
        flags = {"STRONGLY_TYPED": 5} if strongly_typed else {}
        self.NetworkDefinitionCreationFlag = SimpleNamespace(**flags)
        self.BuilderFlag = SimpleNamespace(FP16="FP16")
        self.MemoryPoolType = SimpleNamespace(WORKSPACE="WORKSPACE")
        self.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
        self.set_flags, self.network_flags = [], []
        fake = self

        class Config:
            def set_memory_pool_limit(self, pool, size):
                pass

            def set_flag(self, flag):
                fake.set_flags.append(flag)

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
    engine, build_s, typing_mode, plan_bytes = script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    assert (engine, typing_mode, plan_bytes) == ("engine", "strong", 1234)
    assert trt.network_flags == [1 << 5]
    assert trt.set_flags == []  # TensorRT 11 has no BuilderFlag.FP16: precision comes from the ONNX types
    assert build_s >= 0


def test_old_tensorrt_without_strong_typing_uses_the_fp16_flag(tmp_path):
    script = load_script()
    trt = FakeTensorRT(strongly_typed=False)
    _, _, typing_mode, _ = script.build_tensorrt_engine(trt, tmp_path / "m.onnx", 64)
    assert typing_mode.startswith("weak")
    assert trt.network_flags == [0] and trt.set_flags == ["FP16"]


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
