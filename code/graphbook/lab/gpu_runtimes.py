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
import torch

from graphbook.lab import gpu_profiling as gp
from graphbook.lab.tensorrt_engines import (
    build_tensorrt_engine,
    quantize_symmetric,
    tensorrt_qdq_problem,
    tensorrt_runner,
)
from graphbook.measure import timing
from graphbook.record.cli import comma_choices, make_parser, positive_int
from graphbook.runtimes import correctness, onnx_utils as ou, quantization
from graphbook.runtimes.onnx_utils import CUDA_PROVIDER, TENSORRT_PROVIDER, available_providers

PROG = "gpu_tensorrt.py"
KIND = "gpu-tensorrt"
VARIANTS = ("eager_fp32", "eager_fp16_half", "ort_cuda_fp32", "ort_tensorrt_fp16", "tensorrt_fp16",
            "tensorrt_int8_qdq", "tensorrt_int8_qdq_symmetric")
SMOKE_GPU_ONLY = "smoke run on the CPU: this variant needs the GPU"
#: Chapter 4's calibration: three synthetic inputs with these seeds.
CALIBRATION_SEEDS = (100, 101, 102)
COLUMNS = ["variant", "description", "precision", "fp16_method", "runtime", "runtime_version", "stream",
           "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "device",
           "speedup_vs_eager", "expected_to_match_eager", "max_abs_diff", "relative_diff", "same_output",
           "same_peak_frames", "peak_frames", "same_peaks", "compile_s", "build_s_timing_cache",
           "timing_cache_bytes", "engine_cache", "trt_typing", "engine_bytes", "qdq_source", "note", "smoke"]


def parse_args(argv=None) -> argparse.Namespace:
    """``gpu_tensorrt.py``'s options (Chapter 4); bad values exit 2 with one line on stderr."""
    parser = make_parser(PROG, "BlurBall on ONNX Runtime's GPU providers and TensorRT (Chapter 4).")
    parser.add_argument("--variants", type=comma_choices(VARIANTS, "variant"), default=VARIANTS,
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
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

def _blank_row(variant: str, smoke: bool) -> dict:
    """A row of :data:`COLUMNS` for ``variant``, every measurement empty (Chapter 4)."""
    row = {c: "" for c in COLUMNS}
    row.update(variant=variant, smoke=bool(smoke))
    return row


def _finish_rows(rows: list[dict]) -> list[dict]:
    """Speed-ups over eager FP32 (same run) and every column of :data:`COLUMNS` in every row (Chapter 4)."""
    eager = next((r["median_ms"] for r in rows if r["variant"] == "eager_fp32" and r["median_ms"] != ""), None)
    rows = [{c: row.get(c, "") for c in COLUMNS} for row in rows]
    for row in rows:
        if eager and row["median_ms"] != "":
            row["speedup_vs_eager"] = eager / row["median_ms"]
    return rows


def measure(args, status, log=print) -> list[dict]:
    """Measure every requested variant; one row each, measured or with the reason it was not (Chapter 4)."""
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    model, x = gp.model_and_input(smoke, device)
    model16 = copy.deepcopy(model).half()
    frames = [gp.lab_input(smoke, seed=s) for s in CALIBRATION_SEEDS]
    with torch.no_grad():
        reference = model(x).float()
    x16 = x.half().contiguous()
    stream = torch.cuda.Stream() if device == "cuda" else None
    rows: list[dict] = []

    def stream_context():
        if stream is None:
            return contextlib.nullcontext()
        stream.wait_stream(torch.cuda.current_stream())  # inputs written on the default stream first
        return torch.cuda.stream(stream)

    def record(row, run, expected_to_match):
        """Check ``run()`` against eager FP32, then time it on the variant's stream."""
        with stream_context(), torch.no_grad():
            output = run()
            gp.synchronizer(device)()
            check = correctness.compare_to_reference(output.float(), reference)
            result = timing.time_cpu(run, warmup=args.warmup, repeats=args.repeats)  # the Timer syncs CUDA
        check.pop("reference_scale", None)
        row.update(check, expected_to_match_eager=expected_to_match, device=device, **result.as_dict())
        log(f"{row['variant']:>28s}: median {result.median_ms:8.3f} ms  max|diff| {check['max_abs_diff']:.2e}  "
            f"peaks {check.get('same_peak_frames')}/{check.get('peak_frames')}")

    def attempt(variant, body, **fields):
        if variant not in args.variants:
            return
        row = _blank_row(variant, smoke)
        row.update(fields)
        try:
            body(row)
        except Exception as error:  # a lab run records what worked and says what did not
            row["note"] = gp.failure_note(error)
            log(f"{variant}: FAILED: {row['note']}")
        rows.append(row)

    def skip(row, reason):
        row["note"] = f"skipped: {reason}"
        log(f"{row['variant']}: {row['note']}")

    attempt("eager_fp32", lambda row: record(row, lambda: model(x), True), description="eager PyTorch, FP32",
            precision="fp32", runtime="torch", runtime_version=torch.__version__)
    attempt("eager_fp16_half", lambda row: record(row, lambda: model16(x16), False),
            description="eager PyTorch, model.half() and input in FP16", precision="fp16", fp16_method=gp.FP16_HALF,
            runtime="torch", runtime_version=torch.__version__)

    with contextlib.ExitStack() as stack:
        base = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-trt-")))
        workdir = Path(base) / dt.datetime.now(dt.timezone.utc).strftime("run-%Y%m%dT%H%M%S%fZ")
        workdir.mkdir(parents=True)
        builders = {
            "fp32": lambda: ou.export_onnx(model, x, workdir / "blurball_fp32.onnx"),
            "fp16": lambda: ou.export_onnx(model16, x16, workdir / "blurball_fp16.onnx"),
            "qdq_ch4": lambda: args.qdq_model or quantization.quantize_qdq(
                onnx_file("fp32"), workdir / "blurball_int8_qdq.onnx", frames),
            "qdq_symmetric": lambda: quantize_symmetric(
                onnx_file("fp32"), workdir / "blurball_int8_qdq_sym.onnx", frames),
        }

        @functools.cache  # each file is built once, when a variant first needs it
        def onnx_file(kind):
            return builders[kind]()

        out_shape = tuple(reference.shape)

        def ort_cuda(row):
            if smoke:  # the same session, binding and check, on the provider a CPU has
                session = ou.make_session(onnx_file("fp32"), level="all", threads=2, providers=[ou.CPU_PROVIDER])
                row.update(note="smoke: CPUExecutionProvider stands in for CUDA", stream="none (CPU)")
                record(row, _ort_runner(session, x, out_shape, torch.float32, device="cpu"), True)
                return
            if not status.ort_cuda:
                return skip(row, "ONNX Runtime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
            session = ou.make_session(onnx_file("fp32"), level="all", threads=1, providers=[ou.CUDA_PROVIDER],
                                      provider_options=[_ort_stream_options(stream)])
            if session.get_providers()[0] != ou.CUDA_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            record(row, _ort_runner(session, x, out_shape, torch.float32), True)

        def ort_tensorrt(row):
            if smoke:
                return skip(row, SMOKE_GPU_ONLY)
            if not status.ort_tensorrt:
                return skip(row, "ONNX Runtime has no TensorrtExecutionProvider here")
            cache = workdir / "ort_trt_cache"
            cache.mkdir(parents=True, exist_ok=True)
            row["engine_cache"] = _engine_cache_state(cache)
            options = {**_ort_stream_options(stream), "trt_engine_cache_enable": "True",
                       "trt_engine_cache_path": str(cache)}
            start = time.perf_counter()
            session = ou.make_session(onnx_file("fp16"), level="all", threads=1,
                                      providers=[ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER],
                                      provider_options=[options, _ort_stream_options(stream)])
            if session.get_providers()[0] != ou.TENSORRT_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            run = _ort_runner(session, x16, out_shape, torch.float16)
            with stream_context():
                run()  # the TensorRT provider builds its engine on the first run
                torch.cuda.synchronize()
            row["compile_s"] = time.perf_counter() - start
            record(row, run, False)

        def tensorrt_build_and_run(row, onnx_path, int8=False):
            if not status.tensorrt:
                return skip(row, "the tensorrt Python package is not installed (or there is no CUDA device)")
            import tensorrt as trt

            first = build_tensorrt_engine(trt, onnx_path, args.workspace_mib, int8=int8)
            second = build_tensorrt_engine(trt, onnx_path, args.workspace_mib, timing_cache=first.timing_cache,
                                           int8=int8)
            row.update(runtime_version=trt.__version__, compile_s=first.build_s,
                       build_s_timing_cache=second.build_s, timing_cache_bytes=len(first.timing_cache),
                       trt_typing=first.typing, engine_bytes=first.plan_bytes)
            record(row, tensorrt_runner(trt, second.engine, x, stream), False)

        def tensorrt_fp16(row):
            path = onnx_file("fp16")  # exported in the smoke run too: the export path is part of the check
            if smoke:
                return skip(row, SMOKE_GPU_ONLY)
            tensorrt_build_and_run(row, path)

        def tensorrt_qdq(kind):
            def body(row):
                try:
                    path = onnx_file(kind)
                except Exception as error:  # quantization tooling absent or refusing the model
                    return skip(row, f"no Q/DQ model: {type(error).__name__}: {error}"[:250])
                row["qdq_source"] = (str(args.qdq_model) if kind == "qdq_ch4" and args.qdq_model
                                     else "chapter 4's recipe" + ("" if kind == "qdq_ch4" else ", int8 symmetric"))
                problem = tensorrt_qdq_problem(path)
                if problem is not None:
                    return skip(row, problem)
                if smoke:
                    return skip(row, SMOKE_GPU_ONLY)
                tensorrt_build_and_run(row, path, int8=True)
            return body

        attempt("ort_cuda_fp32", ort_cuda, description="ONNX Runtime, CUDA provider, FP32, level all",
                precision="fp32", runtime="onnxruntime", runtime_version=ou.ort_version(), stream="dedicated")
        attempt("ort_tensorrt_fp16", ort_tensorrt, description="ONNX Runtime, TensorRT provider, FP16 ONNX file",
                precision="fp16", fp16_method=gp.FP16_ONNX, runtime="onnxruntime",
                runtime_version=ou.ort_version(), stream="dedicated")
        attempt("tensorrt_fp16", tensorrt_fp16, description="TensorRT engine from the FP16 ONNX file",
                precision="fp16", fp16_method=gp.FP16_ONNX, runtime="tensorrt", stream="dedicated")
        attempt("tensorrt_int8_qdq", tensorrt_qdq("qdq_ch4"), description="TensorRT engine from chapter 4's Q/DQ model",
                precision="int8", runtime="tensorrt", stream="dedicated")
        attempt("tensorrt_int8_qdq_symmetric", tensorrt_qdq("qdq_symmetric"),
                description="TensorRT engine from chapter 4's recipe quantized symmetric int8",
                precision="int8", runtime="tensorrt", stream="dedicated")
    return _finish_rows(rows)


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
