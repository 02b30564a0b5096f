"""Reduce the freezing miscompile by delta debugging, from the reproducer's HRNet to a few convolutions."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from graphbook.freezing import miscompile
from graphbook.measure import environment
from graphbook.record import cli, results
from graphbook.record.cli import comma_choices, make_parser, positive_float
from graphbook.freezing import minimizer

#: The docstring (and ``--help``) of the reproducer ``--write-repro`` writes.
REPRO_DOC = """Inductor CPU, freezing=True: a fused kernel reads a buffer before the in-place oneDNN conv + add into it.
Torch only; reduced by code/minimize_freezing.py from code/repro_freezing_miscompile.py. Exit 1 while the
compiled output differs from eager, 0 once fixed."""
PHASES = ("tail", "output", "summand", "node", "channels", "size")


def parse_args(argv=None):
    parser = make_parser("minimize_freezing.py", __doc__.splitlines()[0])
    cli.add_input_size(parser, (32, 64))
    cli.add_threads(parser)
    parser.add_argument("--candidate-timeout", type=positive_float, default=180,
                        help="seconds one candidate may take in its fresh process (default 180)")
    parser.add_argument("--budget", type=positive_float, default=1800,
                        help="seconds for the whole search; it stops with what it has (default 1800)")
    parser.add_argument("--phases", type=comma_choices(PHASES, "phase"), default=PHASES,
                        help=f"comma-separated, in order, from {', '.join(PHASES)} (default: all)")
    parser.add_argument("--start", type=Path, default=None, metavar="FILE",
                        help="continue from a program an earlier run wrote with --write-repro")
    parser.add_argument("--write-repro", type=Path, default=None, metavar="FILE",
                        help="write the smallest failing program there as a standalone script")
    args = parser.parse_args(argv)
    if args.start is not None and not args.start.is_file():
        parser.error(f"--start: {args.start} is not a file")
    if args.write_repro is not None and not args.write_repro.parent.is_dir():
        parser.error(f"--write-repro: folder {args.write_repro.parent} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.start is not None:
        try:
            program = minimizer.load_program(args.start)
        except (ValueError, SyntaxError) as error:
            print(f"minimize_freezing.py: error: --start: {error}", file=sys.stderr)
            return cli.EXIT_USAGE
    else:
        model, (x,) = miscompile.check_model("repro", args.height, args.width)
        program = minimizer.capture(model, x)
    print(f"captured: {program.describe()}", flush=True)
    log = lambda s: print(f"step {s.step:3d} [{s.phase}] {s.outcome:>9} {s.seconds:6.1f} s  {s.program}; "
                          f"removed {s.removed[:90]}", flush=True)
    try:
        smallest, steps = minimizer.minimize(program, candidate_timeout=args.candidate_timeout,
                                             budget=args.budget, log=log, phases=args.phases)
    except ValueError as error:
        return cli.resource_absent("minimize_freezing.py", str(error))
    start = (f"an earlier run's smallest program ({program.describe()})" if args.start
             else f"code/repro_freezing_miscompile.py at {args.height}x{args.width}")
    rows = [{**vars(step), "start": start, "final": step.program == smallest.describe() and step.still_failing}
            for step in steps]
    if args.write_repro is not None:
        args.write_repro.write_text(minimizer.to_source(smallest, threads=args.threads, doc=REPRO_DOC))
        print(f"wrote the smallest failing program to {args.write_repro}")
    print(f"smallest failing program: {smallest.describe()}")
    return results.write_and_report("freezing-minimize", rows, environment.fingerprint(args.threads),
                                    results_dir=args.results_dir, wrote="wrote {path} ({n} steps)")


if __name__ == "__main__":
    sys.exit(main())
