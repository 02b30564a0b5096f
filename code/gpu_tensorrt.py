"""BlurBall on the GPU runtimes of Chapter 4: ONNX Runtime's CUDA and TensorRT providers, TensorRT engines.

    .venv/bin/python code/gpu_tensorrt.py                  # on a lab machine with a CUDA GPU
    .venv/bin/python code/gpu_tensorrt.py --repeats 100 --workdir /tmp/trt
    .venv/bin/python code/gpu_tensorrt.py --smoke --results-dir /tmp/smoke   # the whole pipeline on a CPU

For the lab engineer. Everything optional is detected at run time: torch's CUDA device (required),
the ``onnxruntime-gpu`` providers (CUDA, TensorRT) and the ``tensorrt`` Python package. At batch 1 and
288 x 512 it measures each variant this machine can run, and records every other one with the reason:

- ``eager_fp32``, and ``eager_fp16_half``: the model and input converted with ``model.half()``
  (``fp16_method`` says so: ``gpu_blurball.py``'s FP16 is autocast on FP32 weights, not comparable);
- ``ort_cuda_fp32``: the FP32 ONNX file on ONNX Runtime's CUDA provider (inputs bound on the GPU);
- ``ort_tensorrt_fp16``: the FP16 ONNX file on ONNX Runtime's TensorRT provider, its engine cache in a
  new folder for this run (so ``compile_s`` is a build, never a cache load; ``engine_cache`` says which);
- ``tensorrt_fp16``: an engine built with the ``tensorrt`` package from the FP16 ONNX file, built twice:
  with an empty timing cache (``compile_s``) and again with the timing cache of the first build
  (``build_s_timing_cache``);
- ``tensorrt_int8_qdq``: an engine from chapter 4's Q/DQ model (``--qdq-model FILE``, or rebuilt with the
  chapter's recipe) when TensorRT can take it; TensorRT accepts only symmetric INT8 Q/DQ (int8, zero
  point 0), so a model with uint8 activations is recorded as skipped with that reason, and
- ``tensorrt_int8_qdq_symmetric``: the chapter's recipe with TensorRT's constraint (int8 activations and
  weights, symmetric ranges).

TensorRT and ONNX Runtime run on a dedicated CUDA stream, passed explicitly (``execute_async_v3(handle)``
and ONNX Runtime's ``user_compute_stream``): ONNX Runtime treats handle 0 (torch's default stream) as
"no user stream" and TensorRT warns that the default stream costs extra synchronizations. A failed
enqueue (``execute_async_v3`` returns False) raises instead of being timed. FP16 engines come from the
graph's own types on a strongly typed network (TensorRT 11 removed ``BuilderFlag.FP16``/``INT8``); only a
TensorRT without ``STRONGLY_TYPED`` falls back to the builder flags.

Each variant is compared with eager FP32 on the same device, then timed with CUDA events on its stream.
Rows go to a new file ``gpu-tensorrt-<device>-<date>[-N].csv`` under --results-dir (default
data/results). ``--smoke`` runs every step the CPU can (a tiny stand-in model at 32 x 64, two timed
calls, ONNX Runtime's CPU provider in place of CUDA, both Q/DQ models built and checked); it needs
--results-dir. Exit status: 0 ok; 1 a variant failed (rows still written); 2 bad arguments; 3 no CUDA
device, or none of the GPU runtimes installed (outside --smoke; nothing written).

The measurement itself is :mod:`graphbook.lab.gpu_runtimes`; this file is the command line.
"""
from __future__ import annotations

import sys

import torch

from graphbook.lab import gpu_runtimes, gpu_runtimes as gr
from graphbook.measure.environment import fingerprint
from graphbook.record.cli import EXIT_CHECK_FAILED, exit_status_for


def main(argv: list[str] | None = None) -> int:
    args = gr.parse_args(argv)

    status = gpu_runtimes.detect_gpu_runtimes()
    if not args.smoke:
        if not status.cuda_device:
            print(f"{gr.PROG}: skipped, nothing measured: {status.summary()}", file=sys.stderr)
            return gr.EXIT_NO_GPU
        if not status.anything:
            print(f"{gr.PROG}: skipped, nothing measured: {status.summary()}", file=sys.stderr)
            return gr.EXIT_NO_GPU

    print(status.summary(), flush=True)
    env = fingerprint(threads=torch.get_num_threads())
    env["tensorrt"] = status.tensorrt_version or "absent"
    env["gpu_sm_count"] = (int(torch.cuda.get_device_properties(0).multi_processor_count)
                           if torch.cuda.is_available() and not args.smoke else "")
    env["weights"] = "smoke stand-in model" if args.smoke else "seeded-random"
    rows = gr.measure(args, status)
    if not any(r["median_ms"] != "" for r in rows):
        print(f"{gr.PROG}: nothing was measured: " + "; ".join(r["note"] for r in rows), file=sys.stderr)
        return EXIT_CHECK_FAILED
    path = gr.write_results(rows, env, args.results_dir, "smoke-cpu" if args.smoke else status.cuda_device)
    print(f"wrote {len(rows)} rows to {path}")
    return exit_status_for(gr.PROG, gr.failed_variants(rows))


if __name__ == "__main__":
    sys.exit(main())
