"""BlurBall on a CUDA GPU: the article's Section 5 matrix in one command (Chapter 5)."""
from __future__ import annotations

import sys

from graphbook.lab import gpu_measure as gm
from graphbook.lab import gpu_profiling as gp
from graphbook.record.cli import exit_status_for, resource_absent


def main(argv: list[str] | None = None) -> int:
    args = gm.parse_args(argv)
    if args.cudnn_benchmark_child is not None:
        return gm.run_cudnn_benchmark_child(args)
    if not args.smoke and gm.cuda_problem() is not None:
        return resource_absent(gm.PROG, f"no GPU measurement: {gm.cuda_problem()}")
    env = gm.environment(args)
    frame = gm.measure(args)
    name = "smoke-cpu" if args.smoke else (env["gpu_name"] or "cuda")
    path = gp.write_results(gm.KIND, frame, env, args.results_dir, name)
    print()
    print(gm.format_table(frame))
    print(f"\nwrote {path}")
    return exit_status_for(gm.PROG, gp.failed_variants(frame))


if __name__ == "__main__":
    sys.exit(main())
