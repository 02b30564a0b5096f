"""Where BlurBall's CPU speed-up comes from: the attribution ladder of Chapter 5, recorded."""
from __future__ import annotations

import sys
import time

import torch

from graphbook.config import FULL_SIZE
from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball
from graphbook.record import cli, results
from graphbook.record.results import COMPILE_S
from graphbook.method.bench import build_check_time
from graphbook.teach import attribution


def parse_args(argv=None):
    parser = cli.make_parser("bench_attribution.py", __doc__.splitlines()[0])
    cli.add_input_size(parser, FULL_SIZE)
    cli.add_run_protocol_options(parser, repeats=8, warmup=2)
    return parser.parse_args(argv)


def run(args) -> tuple[object, list[str]]:
    """Build and check every rung once, time them in ``args.runs`` runs, write one new file: its path, the failures."""
    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    with torch.no_grad():
        reference = model(x)
    torch._dynamo.reset()

    def first_call(runner):  # the first call compiles the compiled rungs: that is their build
        start = time.perf_counter()
        runner(x)
        return runner, {COMPILE_S: round(time.perf_counter() - start, 3)}

    runners = attribution.build_rungs(model, x)
    frame, failed = build_check_time(
        {name: (lambda runner=runner: first_call(runner)) for name, runner in runners.items()}, x, reference,
        columns={name: {"height": args.height, "width": args.width, "batch": 1} for name in runners},
        runs=args.runs, warmup=args.warmup, repeats=args.repeats, interleave=True,
        log=lambda line: print(line, flush=True))
    path = results.write_run("attribution", frame, env, results_dir=args.results_dir, per_run=True)
    steps, total = attribution.ladder(results.load("attribution", path.parent).query("source_file == @path.name"))
    for step in steps:
        print(f"  {step.rung:24s} {step.median_ms:8.1f} ms  step {step.step:5.2f}x  cumulative {step.cumulative:5.2f}x")
    print(f"total {total['total']:.2f}x measured, rungs multiply to {total['product']:.2f}x "
          f"(residual {total['residual']:.2f}); wrote {len(frame)} rows ({args.runs} runs) to {path}")
    return path, failed


def main(argv: list[str] | None = None) -> int:
    """Parse, run, then the exit status of ``graphbook.record.cli`` (1 when a rung differs from eager)."""
    _, failed = run(parse_args(argv))
    return cli.exit_status_for("bench_attribution.py", failed)


if __name__ == "__main__":
    sys.exit(main())
