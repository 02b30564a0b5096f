"""BlurBall on a CUDA GPU: the article's Section 5 matrix in one command (Chapter 5).

    .venv/bin/python code/gpu_blurball.py                       # full matrix, ~3-8 minutes
    .venv/bin/python code/gpu_blurball.py --skip-max-autotune   # the same without the slow mode
    .venv/bin/python code/gpu_blurball.py --smoke --results-dir /tmp/smoke   # the whole pipeline on a CPU

Measures, at batch 1 and 3 x 288 x 512 input: eager FP32 and FP16 (FP16 here always means
``torch.autocast`` with float16 on unchanged FP32 weights, recorded as ``fp16_method=autocast``; it is
not comparable with ``model.half()`` in ``gpu_tensorrt.py``); torch.compile default, reduce-overhead and
max-autotune in both precisions; channels-last eager in both precisions; cuDNN benchmark on and off.

- Each configuration is compared with eager FP32 (max abs diff, per-frame heatmap peaks), then timed
  with CUDA events (median of --repeats after --warmup).
- First calls are timed with the device synchronized before the clock stops, compiles in a fresh
  Inductor cache; the CUDA-graph modes (reduce-overhead, max-autotune) also record the second call,
  which is when the graph is recorded (``compile_s`` holds the first call, ``second_call_s`` the second).
- The ``+cudnn_benchmark`` rows are measured in a child process that sets
  ``torch.backends.cudnn.benchmark`` before any convolution runs: PyTorch caches convolution plans per
  thread without the flag in the key, so in one process they would reuse the heuristic plans.
- max-autotune rows carry the GPU's SM count and Inductor's ``is_big_gpu`` verdict (below 68 SMs
  Inductor skips its GEMM/convolution templates).
- One forward of eager FP32, eager FP16 and compile-default FP16 is profiled: kernel counts and times
  for convolution, batch norm, casts/copies, element-wise and the rest (by the innermost launching op, user
  annotations such as Inductor's ``## Call CompiledFxGraph ##`` skipped), active GPU time and wall time.

Everything goes to a new file ``gpu-blurball-<device>-<date>[-N].csv`` under --results-dir (default
data/results) with the environment. ``--smoke`` runs every step on the CPU with a tiny stand-in model,
32 x 64 frames and two timed calls (it needs --results-dir, so smoke rows never reach the book's data).
Exit status: 0 ok; 1 a variant failed (results still written, named on stderr); 2 bad arguments;
3 no CUDA (outside --smoke). Works with torch 2.11 and newer.

The measurement itself is :mod:`graphbook.lab.gpu_measure` (the chapter calls it too); this file is the
command line.
"""
from __future__ import annotations

import sys

from graphbook.lab import gpu_measure as gm
from graphbook.record.cli import EXIT_RESOURCE_ABSENT, exit_status_for


def main(argv: list[str] | None = None) -> int:
    args = gm.parse_args(argv)
    if args.cudnn_benchmark_child is not None:
        return gm.run_cudnn_benchmark_child(args)
    if not args.smoke:
        problem = gm.cuda_problem()
        if problem is not None:
            print(f"{gm.PROG}: no GPU measurement: {problem}", file=sys.stderr)
            return EXIT_RESOURCE_ABSENT
    device = "cpu" if args.smoke else "cuda"
    env = gm.environment(args, device)
    rows = gm.measure(args)
    name = "smoke-cpu" if args.smoke else (env["gpu_name"] or "cuda")
    path = gm.write_results(rows, env, args.results_dir, name)
    print()
    print(gm.format_table(rows))
    print(f"\nwrote {path}")
    return exit_status_for(gm.PROG, gm.failed_variants(rows))


if __name__ == "__main__":
    sys.exit(main())
