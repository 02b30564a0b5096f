"""BlurBall on the GPU runtimes of Chapter 4: ONNX Runtime's CUDA and TensorRT providers, TensorRT engines."""
from __future__ import annotations

import sys

import torch

from graphbook.lab import gpu_runtimes as gr
from graphbook.measure.environment import fingerprint
from graphbook.record.cli import EXIT_CHECK_FAILED, exit_status_for


def main(argv: list[str] | None = None) -> int:
    args = gr.parse_args(argv)

    status = gr.detect_gpu_runtimes()
    if not args.smoke and not status.anything:  # every runtime needs a CUDA device too
        print(f"{gr.PROG}: skipped, nothing measured: {status.summary()}", file=sys.stderr)
        return gr.EXIT_NO_GPU

    print(status.summary(), flush=True)
    env = {**fingerprint(threads=torch.get_num_threads()), "tensorrt": status.tensorrt_version or "absent",
           "gpu_sm_count": (int(torch.cuda.get_device_properties(0).multi_processor_count)
                            if torch.cuda.is_available() and not args.smoke else ""),
           "weights": "smoke stand-in model" if args.smoke else "seeded-random"}
    rows = gr.measure(args, status)
    if not any(r["median_ms"] != "" for r in rows):
        print(f"{gr.PROG}: nothing was measured: " + "; ".join(r["note"] for r in rows), file=sys.stderr)
        return EXIT_CHECK_FAILED
    path = gr.write_results(rows, env, args.results_dir, "smoke-cpu" if args.smoke else status.cuda_device)
    print(f"wrote {len(rows)} rows to {path}")
    return exit_status_for(gr.PROG, gr.failed_variants(rows))


if __name__ == "__main__":
    sys.exit(main())
