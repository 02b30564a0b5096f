"""Command lines shared by the book's scripts (introduced with ``code/03_fusion.py``, Chapter 2).

One parser for every script (:class:`OneLineParser`, made by :func:`make_parser`): bad arguments give
one line on stderr and exit status 2, never a traceback; results go to ``--results-dir DIR``. One
exit-status policy (the README documents it):

- ``0`` (:data:`EXIT_OK`): every measurement ran and every variant passed its correctness check;
- ``1`` (:data:`EXIT_CHECK_FAILED`): a variant failed its correctness check; the results are still
  written (the failure is a finding, recorded with the rows) and the failing variants are named on stderr;
- ``2`` (:data:`EXIT_USAGE`): bad arguments;
- ``3`` (:data:`EXIT_RESOURCE_ABSENT`): a required resource is absent (no CUDA, no TensorRT, ...).

Standard library only, so a script can validate its arguments before importing torch.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_RESOURCE_ABSENT = 3


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2 (the book's script rule, Chapter 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def directory(text: str) -> Path:
    """An argparse type for an output folder: it exists as a folder or can be created (Chapter 2).

    Nothing is created while parsing (a refused command line leaves no trace); the nearest existing
    ancestor must be a writable folder.
    """
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
        ancestor = path
    else:
        ancestor = next((p for p in path.absolute().parents if p.exists()), Path("/"))
        if not ancestor.is_dir():
            raise argparse.ArgumentTypeError(f"{text} cannot be created: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def make_parser(prog: str, description: str, *, results_dir: bool = True) -> OneLineParser:
    """The book's parser for one script, with ``--results-dir DIR`` unless ``results_dir=False`` (Chapter 2).

    ``--results-dir`` defaults to ``None``, which the results writer reads as ``paths.RESULTS_DIR``
    (``data/results``, or the folder named by the environment variable ``GRAPHBOOK_RESULTS_DIR``).
    """
    parser = OneLineParser(prog=prog, description=description)
    if results_dir:
        parser.add_argument("--results-dir", type=directory, default=None, metavar="DIR",
                            help="folder the results CSV goes to (default: data/results, or $GRAPHBOOK_RESULTS_DIR)")
    return parser


def exit_status_for(prog: str, failed_variants) -> int:
    """:data:`EXIT_CHECK_FAILED` with one line on stderr naming ``failed_variants``; else :data:`EXIT_OK` (Chapter 2).

    Call it after the results are written: a failed correctness check is recorded, then reported.
    """
    failed = list(dict.fromkeys(failed_variants))
    if not failed:
        return EXIT_OK
    print(f"{prog}: failed its correctness check against eager: {', '.join(map(str, failed))}", file=sys.stderr)
    return EXIT_CHECK_FAILED


def run_checked(prog: str, parse_args, run, argv=None) -> int:
    """A benchmark's ``main``: parse ``argv``, ``run(args)`` (which writes the results and returns
    ``(anything, failed_variants)``), then the exit status of :func:`exit_status_for` (Chapter 2)."""
    _, failed = run(parse_args(argv))
    return exit_status_for(prog, failed)


def _converted(text: str, convert, expected: str):
    """``convert(text)``, or an argparse error saying what was expected."""
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (Chapter 2)."""
    value = _converted(text, int, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def int_at_least(minimum: int):
    """An argparse type factory: an integer of at least ``minimum`` (Chapter 6)."""
    def parse(text: str) -> int:
        value = _converted(text, int, "an integer")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = f"int_at_least_{minimum}"
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (Chapter 6)."""
    value = _converted(text, float, "a number")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def multiple_of_8(text: str) -> int:
    """An argparse type for BlurBall frame sizes: positive and divisible by 8 (three stride-2 levels).

    Introduced in Chapter 3 (``code/bench_ablation.py``); every BlurBall script uses it.
    """
    value = positive_int(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"expected a multiple of 8 (BlurBall downsamples 3 times), got {value}")
    return value


def add_input_size(parser: argparse.ArgumentParser, *, height: int, width: int, height_note: str = "") -> None:
    """Add ``--height``/``--width`` (multiples of 8, BlurBall's stride) with their defaults in the help (Chapter 2).

    ``height_note`` is appended inside the height's "(default N...)" help, e.g. ``", the training size"``.
    """
    parser.add_argument("--height", type=multiple_of_8, default=height,
                        help=f"input height (default {height}{height_note})")
    parser.add_argument("--width", type=multiple_of_8, default=width, help=f"input width (default {width})")


def add_run_protocol_options(parser: argparse.ArgumentParser, *, repeats: int, warmup: int, runs_help: str) -> None:
    """Add ``--threads``, ``--repeats``, ``--warmup`` and ``--runs`` (at least 3), the options of a benchmark timed in
    the book's run protocol (:func:`graphbook.measure.timing.repeated_runs`; Chapter 3)."""
    parser.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=positive_int, default=repeats, help="timed calls per variant and run")
    parser.add_argument("--warmup", type=positive_int, default=warmup, help="untimed calls per variant and run")
    parser.add_argument("--runs", type=int_at_least(3), default=3, help=f"independent timed runs, {runs_help} (default 3, "
                                                                       "at least 3)")


def add_load_test_options(parser: argparse.ArgumentParser) -> None:
    """Add the options of a bounded loopback load test on the book's server (Chapter 7): the input size,
    ``--concurrency``, ``--requests``, ``--time-limit``, ``--max-queue``, ``--max-wait-ms``,
    ``--overload-clients`` and ``--threads``, with the same defaults wherever a load test runs."""
    add_input_size(parser, height=96, width=160)
    parser.add_argument("--concurrency", type=positive_int_list, default="1,2,4,8",
                        help="client counts to try (default 1,2,4,8)")
    parser.add_argument("--requests", type=positive_int, default=24,
                        help="requests per level, at least 4 per client (default 24)")
    parser.add_argument("--time-limit", type=positive_int, default=60, help="seconds per level at most (default 60)")
    parser.add_argument("--max-queue", type=positive_int, default=8, help="the book server's queue bound (default 8)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the batcher's wait for company (default 5)")
    parser.add_argument("--overload-clients", type=int, default=24,
                        help="clients of the last level, beyond the queue bound (0 skips it; default 24)")
    parser.add_argument("--threads", type=positive_int, default=2, help="intra-op threads (default 2)")


def positive_int_list(text: str) -> tuple[int, ...]:
    """An argparse type for batch sizes and the like: comma-separated positive integers, e.g. ``1,2,3``.

    Introduced in Chapter 6 (``code/bench_compile_cache.py``).
    """
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def comma_choices(allowed, what: str):
    """An argparse type for a comma-separated selection from ``allowed``, e.g. ``eager,ort-raw`` (Chapter 6).

    Returns the chosen names in the order given, duplicates dropped; an unknown or empty selection is
    an argparse error naming ``what`` and listing the choices (``code/bench_restart_paths.py --paths``,
    ``code/bench_serving_load.py --runtimes``).
    """
    allowed = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or repr(text)}; "
                                             f"choose from {','.join(allowed)}")
        return names

    return parse


def resource_absent(prog: str, message: str) -> int:
    """Print ``message`` (why the script cannot run here) as one line; return :data:`EXIT_RESOURCE_ABSENT`.

    Introduced in Chapter 4 (``code/bench_int8.py``).
    """
    print(f"{prog}: {message}", file=sys.stderr)
    return EXIT_RESOURCE_ABSENT
