"""BlurBall on the GPU runtimes of Chapter 4: ONNX Runtime's CUDA and TensorRT providers, TensorRT engines."""
from __future__ import annotations

import sys

from graphbook.lab import gpu_profiling as gp
from graphbook.lab import gpu_runtimes as gr
from graphbook.record.cli import exit_status_for, resource_absent


def main(argv: list[str] | None = None) -> int:
    args = gr.parse_args(argv)

    status = gr.detect_gpu_runtimes()
    if not args.smoke and not status.anything:  # every runtime needs a CUDA device too
        return resource_absent(gr.PROG, f"skipped, nothing measured: {status.summary()}")

    print(status.summary(), flush=True)
    env = gp.environment(args.smoke, tensorrt=status.tensorrt_version or "absent")
    frame = gr.measure(args, status)
    path = gp.write_results(gr.KIND, frame, env, args.results_dir, "smoke-cpu" if args.smoke else status.cuda_device)
    print(f"wrote {len(frame)} rows to {path}")
    return exit_status_for(gr.PROG, gp.failed_variants(frame))


if __name__ == "__main__":
    sys.exit(main())
