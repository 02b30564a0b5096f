"""Restart cost of torch.compile for BlurBall, each path in a fresh process (Chapter 6 and 7)."""
from __future__ import annotations

import sys
import tempfile

from graphbook.compilers import compile_cache
from graphbook.config import BATCH_SIZES, FULL_SIZE
from graphbook.measure.environment import fingerprint
from graphbook.record import results
from graphbook.record.cli import add_input_size, add_threads, make_parser, positive_int, positive_int_list

FACTORIES = {"blurball": "graphbook.model.blurball:build_blurball", "tiny": "graphbook.measure.warmup:tiny_clip_net"}


def parse_args(argv=None):
    p = make_parser("bench_compile_cache.py", __doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(FACTORIES), default="blurball")
    add_input_size(p, FULL_SIZE)
    p.add_argument("--batch-sizes", type=positive_int_list, default=BATCH_SIZES)
    add_threads(p)
    p.add_argument("--mode", default=None, help="torch.compile mode (default: the default mode)")
    p.add_argument("--timeout", type=positive_int, default=3600, help="seconds per fresh process")
    return p.parse_args(argv)


def measure_cache_paths(args, work: str, env: dict) -> int:
    """Cold, warm and artifacts restarts in fresh processes; write and print them."""
    spec = compile_cache.RestartSpec(FACTORIES[args.model], (9, args.height, args.width), args.batch_sizes,
                                     compile_kwargs={"mode": args.mode} if args.mode else {}, threads=args.threads)
    try:
        rows = compile_cache.cache_experiment(spec, work, timeout=args.timeout)
    except compile_cache.CompileCacheError as exc:
        print(f"bench_compile_cache.py: error: {str(exc).splitlines()[-1] if str(exc) else exc}", file=sys.stderr)
        return 1
    output = results.write_run("compile-cache", rows, env, results_dir=args.results_dir)
    print(f"wrote {len(rows)} rows to {output}")
    for scenario in compile_cache.SCENARIOS:
        first = next(r for r in rows if r["scenario"] == scenario)
        per_size = ", ".join(f"b={r['batch_size']}: {r['compile_s']:.2f} s" for r in rows if r["scenario"] == scenario)
        print(f"{scenario:>9}: restart {first['restart_s']:7.2f} s  ({per_size})  "
              f"{first['speedup_vs_cold']:.1f}x faster than cold")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    env = fingerprint(args.threads)
    with tempfile.TemporaryDirectory(prefix="graphbook-bench-cache-") as work:
        return measure_cache_paths(args, work, env)


if __name__ == "__main__":
    sys.exit(main())
