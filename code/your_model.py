"""Your model through the book (Chapter 8): the book's method on any model, its inputs and a check."""
from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
import time

from graphbook.measure.environment import fingerprint, set_threads
from graphbook.record import cli, results
from graphbook.yourmodel import report, spec
from graphbook.yourmodel.run import Settings, run

PROG = "your_model.py"


def parse_args(argv=None):
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    parser.add_argument("--model", required=True, metavar="MODULE:CALLABLE",
                        help="an importable callable that returns the torch.nn.Module, e.g. "
                             "graphbook.model.library:resnet50")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--inputs", metavar="FILE", help="a torch.save file: one tensor, or a tuple of tensors (one per "
                                                        "model argument), samples along dimension 0")
    given.add_argument("--shape", type=cli.positive_int_list, metavar="C,H,W",
                       help="one sample's shape, for random inputs (lower-precision verdicts are then refused)")
    parser.add_argument("--batch", type=cli.positive_int, default=1, help="samples per call (default 1)")
    parser.add_argument("--calibration-samples", type=cli.int_at_least(0), default=None, metavar="N",
                        help="the first N samples calibrate INT8, the rest check every variant (default: half)")
    parser.add_argument("--check", default="elementwise", metavar="CHECK",
                        help="elementwise (default; judges FP32 only), top1, topk:K, or MODULE:FN with "
                             "FN(outputs, references) -> bool or dict with 'passed'")
    parser.add_argument("--quick", action="store_true", help="leave out max-autotune")
    cli.add_run_protocol_options(parser, repeats=10, warmup=3)
    parser.add_argument("--bisect-seconds", type=cli.positive_float, default=600.0,
                        help="time limit of the search for the switch behind a wrong compiled variant (default 600)")
    parser.add_argument("--name", default=None, help="the results file's tag (default: the callable's name)")
    args = parser.parse_args(argv)
    if args.name is not None and not re.fullmatch(r"[A-Za-z0-9_.]+", args.name):
        parser.error(f"--name must be letters, digits, '_' or '.', got {args.name!r}")
    return args


def _inputs(args) -> spec.Samples:
    inputs = spec.load_inputs(args.inputs) if args.inputs else spec.random_inputs(args.shape)
    return spec.split(inputs, batch=args.batch, calibration=args.calibration_samples, random=args.inputs is None)


def main(argv: list[str] | None = None) -> int:
    """Refuse bad arguments and unusable models (exit 2, no file), run every step, write the file and its report;
    exit 1 when a variant failed its check."""
    args = parse_args(argv)
    try:
        check = spec.parse_check(args.check)
        model = spec.build_model(args.model)
        samples = _inputs(args)
        spec.call(model, samples.example)
    except spec.YourModelError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return cli.EXIT_USAGE
    set_threads(args.threads)
    if samples.random:
        print(f"inputs: random, shape {args.shape}: lower-precision verdicts are refused", flush=True)
    settings = Settings(factory=args.model, check=check, threads=args.threads, quick=args.quick, runs=args.runs,
                        repeats=args.repeats, warmup=args.warmup, bisect_seconds=args.bisect_seconds,
                        inputs_file=args.inputs, shape=args.shape, batch=args.batch,
                        calibration=args.calibration_samples if args.calibration_samples is not None
                        else len(samples.calibration) * args.batch,
                        log=lambda line: print(line, flush=True))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="graphbook-inductor-") as cold:
        # a fresh Inductor cache unless the caller chose one: each rung's compile time is a cold compile
        own_cache = "TORCHINDUCTOR_CACHE_DIR" not in os.environ
        if own_cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold
        try:
            env = {**fingerprint(args.threads), "model": args.model, "check": check.name, "quick": args.quick,
                   "inputs": "random" if samples.random else args.inputs, "batch": args.batch,
                   "check_samples": samples.check_samples}
            outcome = run(model, samples, settings, env)
        finally:
            if own_cache:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    tag = args.name or re.sub(r"[^A-Za-z0-9_.]", "_", args.model.rpartition(":")[2]).lower()
    path = results.write_run("your-model", outcome.rows, env, results_dir=args.results_dir, tag=tag, per_run=True)
    command = "python code/your_model.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    page = report.write_report(results.load("your-model", path.parent).query("source_file == @path.name"),
                               path.with_suffix(""), title=f"{args.model} through the book", command=command)
    print(f"wrote {path} and {page} in {time.perf_counter() - start:.0f} s")
    return cli.exit_status_for(PROG, outcome.failed)


if __name__ == "__main__":
    sys.exit(main())
