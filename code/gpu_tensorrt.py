"""BlurBall on the GPU runtimes of Chapter 4: ONNX Runtime's CUDA and TensorRT providers, a TensorRT engine.

    .venv/bin/python code/gpu_tensorrt.py                  # on a lab machine with a CUDA GPU
    .venv/bin/python code/gpu_tensorrt.py --repeats 100 --workdir data/work/trt

For the lab engineer. Everything optional is detected at run time: torch's CUDA device (required),
the ``onnxruntime-gpu`` providers (CUDA, TensorRT) and the ``tensorrt`` Python package. The script
measures, at batch 1 and 288x512, each variant that this machine can run:

- ``eager_fp32`` and ``eager_fp16`` (model and input in half precision): the baselines, same run;
- ``ort_cuda_fp32``: the FP32 ONNX file on ONNX Runtime's CUDA provider (inputs bound on the GPU);
- ``ort_tensorrt_fp16``: the FP16 ONNX file on ONNX Runtime's TensorRT provider;
- ``tensorrt_fp16``: an engine built with the ``tensorrt`` package from the FP16 ONNX file.

FP16 comes from the graph itself (the model is exported in half precision) and the network is
created strongly typed. That is the only way that works on TensorRT 11, which removed the weak-typing
builder flags (``BuilderFlag.FP16``/``INT8``) and the INT8 calibrators in favour of strongly typed
networks and explicit Q/DQ quantization; on TensorRT 10 the same build works with the flag
``STRONGLY_TYPED``. Only a TensorRT too old to have that flag falls back to ``BuilderFlag.FP16``.

Each variant is compared with eager FP32 on the GPU (max abs diff, heatmap peaks) before it is timed
with CUDA events (warm-up, median, spread). Rows go to a new file
``data/results/gpu-tensorrt-<device>-<date>[-N].csv`` with the environment columns. An engine is tied
to the GPU model and the TensorRT version that built it, so engines are rebuilt on every run and
never committed.

Exit status: 0 when something was measured, 2 for bad arguments, 3 when this machine has no CUDA
device (one line on stderr, nothing written), 1 when a variant failed to build or run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphbook.cli import OneLineParser, positive_int

EXIT_NO_GPU = 3
VARIANTS = ("eager_fp32", "eager_fp16", "ort_cuda_fp32", "ort_tensorrt_fp16", "tensorrt_fp16")


def _variant_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {unknown or text!r}; choose from {','.join(VARIANTS)}")
    return names


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(prog="gpu_tensorrt.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--warmup", type=positive_int, default=20)
    parser.add_argument("--repeats", type=positive_int, default=50)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folder for ONNX files and engines (default: a temporary folder)")
    parser.add_argument("--out-dir", type=Path, default=None, help="results folder (default data/results)")
    parser.add_argument("--workspace-mib", type=positive_int, default=2048,
                        help="TensorRT builder workspace limit")
    return parser.parse_args(argv)


def device_slug(name: str) -> str:
    """A file-name-safe form of a GPU name: ``"NVIDIA H200"`` -> ``"nvidia-h200"`` (Chapter 4)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return slug or "unknown-gpu"


def tensorrt_network_flags(trt) -> tuple[int, str]:
    """Network-creation flags and the typing mode for the installed TensorRT (Chapter 4).

    ``STRONGLY_TYPED`` (TensorRT 9 and later) makes the engine keep the ONNX file's types, so an
    FP16 file gives an FP16 engine; on TensorRT 11 strong typing is always on and the flag is
    accepted and ignored. Without the flag (old TensorRT) the caller must set ``BuilderFlag.FP16``.
    """
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if flag is None:
        return 0, "weak (BuilderFlag.FP16)"
    return 1 << int(flag), "strong"


def build_tensorrt_engine(trt, onnx_path: Path, workspace_mib: int):
    """Parse an ONNX file and build a deserialised engine; returns (engine, build_s, typing, plan_bytes)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags, typing_mode = tensorrt_network_flags(trt)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # reads the external weights beside the file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if typing_mode != "strong":
        config.set_flag(trt.BuilderFlag.FP16)  # removed in TensorRT 11; only reached on old versions
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    build_s = time.perf_counter() - start
    if plan is None:
        raise RuntimeError("TensorRT returned no engine (see its log above)")
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    return engine, build_s, typing_mode, int(plan.nbytes)


def tensorrt_runner(trt, engine, x16):
    """A zero-argument function that runs the engine on the current CUDA stream and returns its output."""
    import torch

    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    if len(inputs) != 1 or len(outputs) != 1:
        raise RuntimeError(f"expected one input and one output, got {inputs} and {outputs}")
    dtypes = {trt.DataType.HALF: torch.float16, trt.DataType.FLOAT: torch.float32}
    out_dtype = dtypes[engine.get_tensor_dtype(outputs[0])]
    output = torch.empty(tuple(engine.get_tensor_shape(outputs[0])), dtype=out_dtype, device="cuda")
    context = engine.create_execution_context()
    context.set_tensor_address(inputs[0], x16.data_ptr())
    context.set_tensor_address(outputs[0], output.data_ptr())

    def run():
        context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
        return output

    return run


def ort_runner(session, x, out_shape, dtype):
    """Run an ONNX Runtime GPU session with input and output bound to CUDA tensors (no host copies)."""
    import numpy as np
    import torch

    binding = session.io_binding()
    output = torch.empty(out_shape, dtype=dtype, device="cuda")
    np_type = np.float16 if dtype == torch.float16 else np.float32
    binding.bind_input(session.get_inputs()[0].name, "cuda", 0, np_type, tuple(x.shape), x.data_ptr())
    binding.bind_output(session.get_outputs()[0].name, "cuda", 0, np_type, tuple(output.shape), output.data_ptr())

    def run():
        session.run_with_iobinding(binding)
        return output

    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    from graphbook import onnx_utils as ou

    status = ou.detect_gpu_runtimes()
    if not status.cuda_device:
        print(f"gpu_tensorrt.py: skipped, nothing measured: {status.summary()}", file=sys.stderr)
        return EXIT_NO_GPU

    import torch

    from graphbook import blurball, results, timing
    from graphbook.book import RESULTS_DIR
    from graphbook.environment import fingerprint

    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    print(status.summary(), flush=True)
    model = blurball.build_blurball().cuda()
    x = blurball.example_input().cuda()
    with torch.no_grad():
        reference = model(x).float()
    model16 = blurball.build_blurball().half().cuda()
    x16 = x.half().contiguous()
    rows, notes, failures = [], [], []
    eager_ms = {}

    def record(variant, description, run, extra=None):
        output = run()
        torch.cuda.synchronize()
        diff = ou.max_abs_diff(reference, output.float())
        same, total = ou.peaks_agree(reference, output.float())
        result = timing.time_cuda(run, warmup=args.warmup, repeats=args.repeats, name=variant)
        if variant == "eager_fp32":
            eager_ms["fp32"] = result.median_ms
        rows.append({"run_id": run_id, "variant": variant, "description": description, **(extra or {}),
                     **{k: v for k, v in result.as_dict().items() if k != "name"},
                     "max_abs_diff": diff, "peaks_same": same, "peaks_total": total})
        print(f"{variant:>18s}: median {result.median_ms:8.3f} ms (min {result.min_ms:.3f}, "
              f"max {result.max_ms:.3f})  max|diff| {diff:.2e}  peaks {same}/{total}", flush=True)

    def attempt(variant, body):
        if variant not in args.variants:
            return
        try:
            body()
        except Exception as error:  # a lab run should record what worked and say what did not
            failures.append(f"{variant}: {type(error).__name__}: {error}")
            print(f"{variant}: FAILED: {type(error).__name__}: {error}", file=sys.stderr)

    def eager_fp32():
        with torch.no_grad():
            record("eager_fp32", "eager PyTorch, FP32", lambda: model(x), {"precision": "fp32"})

    def eager_fp16():
        with torch.no_grad():
            record("eager_fp16", "eager PyTorch, model and input in FP16", lambda: model16(x16),
                   {"precision": "fp16"})

    attempt("eager_fp32", eager_fp32)
    attempt("eager_fp16", eager_fp16)

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-trt-")))
        paths = {}

        def onnx_file(precision):
            if precision not in paths:
                net, inp = (model, x) if precision == "fp32" else (model16, x16)
                paths[precision] = ou.export_onnx(net, inp, Path(workdir) / f"blurball_{precision}.onnx")
            return paths[precision]

        out_shape = tuple(reference.shape)

        def ort_cuda():
            if not status.ort_cuda:
                notes.append("ort_cuda_fp32 skipped: ONNX Runtime has no CUDAExecutionProvider here")
                return
            options = {"device_id": 0, "user_compute_stream": str(torch.cuda.current_stream().cuda_stream)}
            session = ou.make_session(onnx_file("fp32"), level="all", threads=1,
                                      providers=[ou.CUDA_PROVIDER], provider_options=[options])
            if session.get_providers()[0] != ou.CUDA_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            record("ort_cuda_fp32", "ONNX Runtime, CUDA provider, FP32, level all",
                   ort_runner(session, x.contiguous(), out_shape, torch.float32),
                   {"precision": "fp32", "runtime_version": ou.ort_version()})

        def ort_tensorrt():
            if not status.ort_tensorrt:
                notes.append("ort_tensorrt_fp16 skipped: ONNX Runtime has no TensorrtExecutionProvider here")
                return
            cache = Path(workdir) / "ort_trt_cache"
            cache.mkdir(parents=True, exist_ok=True)
            options = {"device_id": 0, "trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
                       "user_compute_stream": str(torch.cuda.current_stream().cuda_stream)}
            start = time.perf_counter()
            session = ou.make_session(onnx_file("fp16"), level="all", threads=1,
                                      providers=[ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER],
                                      provider_options=[options, {"device_id": 0}])
            if session.get_providers()[0] != ou.TENSORRT_PROVIDER:
                raise RuntimeError(f"session fell back to {session.get_providers()}")
            run = ort_runner(session, x16, out_shape, torch.float16)
            run()  # the TensorRT provider builds its engine on the first run
            torch.cuda.synchronize()
            build_s = time.perf_counter() - start
            record("ort_tensorrt_fp16", "ONNX Runtime, TensorRT provider, FP16 ONNX file", run,
                   {"precision": "fp16", "runtime_version": ou.ort_version(), "build_s": build_s})

        def tensorrt_engine():
            if not status.tensorrt:
                notes.append("tensorrt_fp16 skipped: the tensorrt Python package is not installed")
                return
            import tensorrt as trt

            engine, build_s, typing_mode, plan_bytes = build_tensorrt_engine(trt, onnx_file("fp16"),
                                                                             args.workspace_mib)
            record("tensorrt_fp16", f"TensorRT {trt.__version__} engine from the FP16 ONNX file",
                   tensorrt_runner(trt, engine, x16),
                   {"precision": "fp16", "runtime_version": trt.__version__, "build_s": build_s,
                    "trt_typing": typing_mode, "engine_bytes": plan_bytes})

        attempt("ort_cuda_fp32", ort_cuda)
        attempt("ort_tensorrt_fp16", ort_tensorrt)
        attempt("tensorrt_fp16", tensorrt_engine)

    for note in notes:
        print(note)
    if not rows:
        print("gpu_tensorrt.py: nothing was measured: " + "; ".join(failures or notes), file=sys.stderr)
        return 1
    columns = ["run_id", "variant", "description", "precision", "runtime_version", "median_ms", "min_ms",
               "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "device", "ratio_to_eager_fp32",
               "max_abs_diff", "peaks_same", "peaks_total", "build_s", "trt_typing", "engine_bytes"]
    for row in rows:
        row["ratio_to_eager_fp32"] = eager_ms["fp32"] / row["median_ms"] if "fp32" in eager_ms else ""
    rows = [{c: row.get(c, "") for c in columns} for row in rows]
    out_dir = args.out_dir or RESULTS_DIR
    path = results.unique_path(out_dir, f"gpu-tensorrt-{device_slug(status.cuda_device)}-{dt.date.today()}")
    results.append_rows(path, rows, env=fingerprint(threads=torch.get_num_threads()))
    print(f"wrote {len(rows)} rows to {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
