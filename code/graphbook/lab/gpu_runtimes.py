"""BlurBall on the GPU runtimes of Chapter 4, behind ``code/gpu_tensorrt.py`` (Chapter 4)."""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import functools
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from graphbook.lab import gpu_profiling as gp
from graphbook.lab.tensorrt_engines import (build_tensorrt_engine, quantize_symmetric, tensorrt_qdq_problem,
                                            tensorrt_runner)
from graphbook.method.bench import build_check_time
from graphbook.method.variants import VariantUnavailable
from graphbook.record.cli import comma_choices, make_parser, positive_int
from graphbook.runtimes import onnx_utils as ou
from graphbook.int8 import quantization
from graphbook.runtimes.onnx_utils import CUDA_PROVIDER, TENSORRT_PROVIDER, available_providers

PROG = "gpu_tensorrt.py"
KIND = "gpu-tensorrt"
VARIANTS = ("eager_fp32", "eager_fp16_half", "ort_cuda_fp32", "ort_tensorrt_fp16", "tensorrt_fp16",
            "tensorrt_int8_qdq", "tensorrt_int8_qdq_symmetric")
SMOKE_GPU_ONLY = "smoke run on the CPU: this variant needs the GPU"
#: Chapter 4's calibration: three synthetic inputs with these seeds.
CALIBRATION_SEEDS = (100, 101, 102)


def parse_args(argv=None) -> argparse.Namespace:
    """``gpu_tensorrt.py``'s options (Chapter 4); bad values exit 2 with one line on stderr."""
    parser = make_parser(PROG, "BlurBall on ONNX Runtime's GPU providers and TensorRT (Chapter 4).")
    parser.add_argument("--variants", type=comma_choices(VARIANTS, "variant"), default=VARIANTS,
                        help=f"comma-separated subset of {','.join(VARIANTS)}; eager_fp32, the reference, "
                             "always runs")
    parser.add_argument("--warmup", type=positive_int, default=20)
    parser.add_argument("--repeats", type=positive_int, default=50)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folder for ONNX files and engines (default: a temporary folder); each run "
                             "uses a new subfolder, so no engine cache is ever reused")
    parser.add_argument("--workspace-mib", type=positive_int, default=2048,
                        help="TensorRT builder workspace limit")
    parser.add_argument("--qdq-model", type=Path, default=None,
                        help="chapter 4's Q/DQ ONNX file (default: rebuilt with the chapter's recipe)")
    return gp.parse_lab_args(parser, argv, "--qdq-model")


# ---- ONNX Runtime
def _ort_stream_options(stream) -> dict:
    """Provider options that put an ONNX Runtime GPU provider on ``stream`` (a dedicated one) (Chapter 4)."""
    return {"device_id": 0, "user_compute_stream": str(gp.stream_handle(stream))}


def _ort_runner(session, x, out_shape, dtype, *, device: str = "cuda"):
    """Run a session with input and output bound to tensors on ``device`` (no host copies) (Chapter 4)."""
    binding = session.io_binding()
    x = x.to(dtype).contiguous()
    output = torch.empty(out_shape, dtype=dtype, device=device)
    np_type = np.float16 if dtype == torch.float16 else np.float32
    binding.bind_input(session.get_inputs()[0].name, device, 0, np_type, tuple(x.shape), x.data_ptr())
    binding.bind_output(session.get_outputs()[0].name, device, 0, np_type, tuple(output.shape), output.data_ptr())
    bound = (x, output)  # the binding holds raw pointers: keep both tensors alive with the runner

    def run():
        session.run_with_iobinding(binding)
        return bound[1]
    return run


def _engine_cache_state(cache_dir: Path) -> str:
    """``"built (empty per-run cache folder)"`` or ``"loaded from a cache"`` for the TensorRT provider (Chapter 4)."""
    cached = any(p.is_file() for p in Path(cache_dir).glob("*"))  # an absent folder globs to nothing
    return "loaded from a cache" if cached else "built (empty per-run cache folder)"


# ---- The run
def measure(args, status, log=print) -> pd.DataFrame:
    """Build, check and time every requested variant and eager FP32 on a dedicated stream (Chapter 4)."""
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    model, x = gp.model_and_input(smoke, device)
    model16 = copy.deepcopy(model).half()
    frames = [gp.lab_input(smoke, seed=s) for s in CALIBRATION_SEEDS]
    with torch.no_grad():
        reference = model(x).float()
    x16 = x.half().contiguous()
    stream = torch.cuda.Stream() if device == "cuda" else None
    out_shape = tuple(reference.shape)

    with contextlib.ExitStack() as stack:
        base = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-trt-")))
        workdir = Path(base) / dt.datetime.now(dt.timezone.utc).strftime("run-%Y%m%dT%H%M%S%fZ")
        workdir.mkdir(parents=True)
        exports = {
            "fp32": lambda: ou.export_onnx(model, x, workdir / "blurball_fp32.onnx"),
            "fp16": lambda: ou.export_onnx(model16, x16, workdir / "blurball_fp16.onnx"),
            "qdq_ch4": lambda: args.qdq_model or quantization.quantize_qdq(
                onnx_file("fp32"), workdir / "blurball_int8_qdq.onnx", frames),
            "qdq_symmetric": lambda: quantize_symmetric(
                onnx_file("fp32"), workdir / "blurball_int8_qdq_sym.onnx", frames),
        }

        @functools.cache  # each file is built once, when a variant first needs it
        def onnx_file(kind):
            return exports[kind]()

        def ort_cuda():
            if smoke:  # the same session, binding and check, on the provider a CPU has
                session = ou.make_session(onnx_file("fp32"), level="all", threads=2, providers=[ou.CPU_PROVIDER])
                return _ort_runner(session, x, out_shape, torch.float32, device="cpu"), {
                    "note": "smoke: CPUExecutionProvider stands in for CUDA", "stream": "none (CPU)"}
            if not status.ort_cuda:
                raise VariantUnavailable("ONNX Runtime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
            session = ou.make_session(onnx_file("fp32"), level="all", threads=1, providers=[ou.CUDA_PROVIDER],
                                      provider_options=[_ort_stream_options(stream)])
            if session.get_providers()[0] != ou.CUDA_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            return _ort_runner(session, x, out_shape, torch.float32), {}

        def ort_tensorrt():
            if smoke:
                raise VariantUnavailable(SMOKE_GPU_ONLY)
            if not status.ort_tensorrt:
                raise VariantUnavailable("ONNX Runtime has no TensorrtExecutionProvider here")
            cache = workdir / "ort_trt_cache"
            cache.mkdir(parents=True, exist_ok=True)
            state = _engine_cache_state(cache)
            options = {**_ort_stream_options(stream), "trt_engine_cache_enable": "True",
                       "trt_engine_cache_path": str(cache)}
            start = time.perf_counter()
            session = ou.make_session(onnx_file("fp16"), level="all", threads=1,
                                      providers=[ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER],
                                      provider_options=[options, _ort_stream_options(stream)])
            if session.get_providers()[0] != ou.TENSORRT_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            run = _ort_runner(session, x16, out_shape, torch.float16)
            run()  # the TensorRT provider builds its engine on the first run
            torch.cuda.synchronize()
            return run, {"compile_s": time.perf_counter() - start, "engine_cache": state}

        def tensorrt_engine(kind):
            def build():
                try:
                    path = onnx_file(kind)  # exported in the smoke run too: the export path is part of the check
                except Exception as error:  # quantization tooling absent or refusing the model
                    if kind == "fp16":
                        raise
                    raise VariantUnavailable(f"no Q/DQ model: {type(error).__name__}: {error}"[:250]) from error
                problem = None if kind == "fp16" else tensorrt_qdq_problem(path)
                if problem is not None or smoke:
                    raise VariantUnavailable(problem or SMOKE_GPU_ONLY)
                if not status.tensorrt:
                    raise VariantUnavailable("the tensorrt Python package is not installed (or there is no CUDA "
                                             "device)")
                import tensorrt as trt

                first = build_tensorrt_engine(trt, path, args.workspace_mib, int8=kind != "fp16")
                second = build_tensorrt_engine(trt, path, args.workspace_mib, timing_cache=first.timing_cache,
                                               int8=kind != "fp16")
                return tensorrt_runner(trt, second.engine, x, stream), dict(
                    compile_s=first.build_s, build_s_timing_cache=second.build_s,
                    timing_cache_bytes=len(first.timing_cache), trt_typing=first.typing, engine_bytes=first.plan_bytes)
            return build

        builds = {"eager_fp32": lambda: (lambda: model(x), {}), "eager_fp16_half": lambda: (lambda: model16(x16), {}),
                  "ort_cuda_fp32": ort_cuda, "ort_tensorrt_fp16": ort_tensorrt,
                  "tensorrt_fp16": tensorrt_engine("fp16"), "tensorrt_int8_qdq": tensorrt_engine("qdq_ch4"),
                  "tensorrt_int8_qdq_symmetric": tensorrt_engine("qdq_symmetric")}
        tensorrt = dict(runtime="tensorrt", runtime_version=status.tensorrt_version or None)
        columns = {
            "eager_fp32": dict(description="eager PyTorch, FP32", precision="fp32", runtime="torch",
                               runtime_version=torch.__version__),
            "eager_fp16_half": dict(description="eager PyTorch, model.half() and input in FP16", precision="fp16",
                                    fp16_method=gp.FP16_HALF, runtime="torch", runtime_version=torch.__version__),
            "ort_cuda_fp32": dict(description="ONNX Runtime, CUDA provider, FP32, level all", precision="fp32",
                                  runtime="onnxruntime", runtime_version=ou.ort_version()),
            "ort_tensorrt_fp16": dict(description="ONNX Runtime, TensorRT provider, FP16 ONNX file", precision="fp16",
                                      fp16_method=gp.FP16_ONNX, runtime="onnxruntime",
                                      runtime_version=ou.ort_version()),
            "tensorrt_fp16": dict(tensorrt, description="TensorRT engine from the FP16 ONNX file", precision="fp16",
                                  fp16_method=gp.FP16_ONNX),
            "tensorrt_int8_qdq": dict(tensorrt, description="TensorRT engine from chapter 4's Q/DQ model",
                                      precision="int8", qdq_source=str(args.qdq_model or "chapter 4's recipe")),
            "tensorrt_int8_qdq_symmetric": dict(
                tensorrt, description="TensorRT engine from chapter 4's recipe quantized symmetric int8",
                precision="int8", qdq_source="chapter 4's recipe, int8 symmetric")}
        names = dict.fromkeys(["eager_fp32", *args.variants])  # every variant is checked against eager FP32
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())  # inputs written on the default stream first
        with torch.no_grad(), torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return build_check_time(
                {name: gp.lab_builder(builds[name]) for name in names}, x, reference, log=log, warmup=args.warmup,
                repeats=args.repeats, columns={name: dict(columns[name], stream="dedicated", expected_to_match_eager=(
                    columns[name]["precision"] == "fp32")) for name in names})[0]


@dataclass
class GpuRuntimes:
    """What this machine offers for the GPU runtimes of Chapter 4, and why something is missing."""

    cuda_device: str = ""
    ort_providers: list[str] = field(default_factory=list)
    tensorrt_version: str = ""
    reasons: list[str] = field(default_factory=list)

    @property
    def ort_cuda(self) -> bool:
        return bool(self.cuda_device) and CUDA_PROVIDER in self.ort_providers

    @property
    def ort_tensorrt(self) -> bool:
        return bool(self.cuda_device) and TENSORRT_PROVIDER in self.ort_providers

    @property
    def tensorrt(self) -> bool:
        return bool(self.cuda_device) and bool(self.tensorrt_version)

    @property
    def anything(self) -> bool:
        return self.ort_cuda or self.ort_tensorrt or self.tensorrt

    def summary(self) -> str:
        """One sentence for a chapter: what can be measured here, or why nothing can."""
        if not self.anything:
            return "No GPU runtime can be measured on this machine: " + "; ".join(self.reasons) + "."
        have = [name for name, ok in (("ONNX Runtime CUDA EP", self.ort_cuda),
                                      ("ONNX Runtime TensorRT EP", self.ort_tensorrt),
                                      (f"TensorRT {self.tensorrt_version}", self.tensorrt)) if ok]
        return f"GPU runtimes available on {self.cuda_device}: " + ", ".join(have) + "."


def detect_gpu_runtimes() -> GpuRuntimes:
    """Detect a CUDA device, ONNX Runtime's GPU providers and the ``tensorrt`` package (Chapter 4)."""
    status = GpuRuntimes(ort_providers=available_providers())
    if torch.cuda.is_available():
        status.cuda_device = torch.cuda.get_device_name(0)
    else:
        status.reasons.append("torch sees no CUDA device")
    if CUDA_PROVIDER not in status.ort_providers:
        status.reasons.append(f"the installed ONNX Runtime offers only {status.ort_providers} "
                              "(the GPU providers come with the separate onnxruntime-gpu package)")
    try:
        import tensorrt  # optional, lab machines only

        status.tensorrt_version = str(getattr(tensorrt, "__version__", "unknown"))
    except Exception:  # absent, or present without its CUDA libraries
        status.reasons.append("the tensorrt Python package is not installed")
    return status
