"""BlurBall on a CUDA GPU: the article's Section 5 matrix in one command (Chapter 5)."""
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
