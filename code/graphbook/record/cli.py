"""The scripts' shared command line: every script is ``main(argv) -> int`` over :func:`make_parser`. Exit
statuses: 0 ok; 1 a variant failed its check (rows still written); 2 bad arguments; 3 a resource is absent."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from graphbook import paths
from graphbook.config import SMALL_SIZE, THREADS

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_RESOURCE_ABSENT = 0, 1, 2, 3


class OneLineParser(argparse.ArgumentParser):
    """argparse whose error is one line on stderr (no usage block), exit status 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def make_parser(prog: str, description: str, *, results_dir: bool = True) -> OneLineParser:
    """A script's parser, with ``--results-dir DIR`` unless the script writes no results."""
    parser = OneLineParser(prog=prog, description=description)
    if results_dir:
        parser.add_argument("--results-dir", type=directory, default=paths.RESULTS_DIR, metavar="DIR",
                            help="folder of the results files (default data/results, or $GRAPHBOOK_RESULTS_DIR)")
    return parser


def directory(text: str) -> Path:
    """An output folder that exists or can be created; nothing is created while parsing."""
    path = Path(text)
    ancestor = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory and cannot become one")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path


def int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value
    return parse


positive_int = int_at_least(1)


def positive_float(text: str) -> float:
    """A finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def multiple_of_8(text: str) -> int:
    """Positive and divisible by 8: BlurBall has three stride-2 levels."""
    value = positive_int(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"expected a multiple of 8 (BlurBall downsamples 3 times), got {value}")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. batch sizes ``1,2,3``."""
    try:
        return tuple(positive_int(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None


def comma_choices(allowed, what: str):
    """A comma-separated selection from ``allowed``, in the order given, duplicates dropped."""
    allowed = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or repr(text)}; "
                                             f"choose from {','.join(allowed)}")
        return names
    return parse


def add_input_size(parser: argparse.ArgumentParser, size: tuple[int, int]) -> None:
    """``--height`` and ``--width``, defaulting to ``size`` (config's FULL_SIZE or SMALL_SIZE for BlurBall's)."""
    height, width = size
    parser.add_argument("--height", type=multiple_of_8, default=height, help=f"input height (default {height})")
    parser.add_argument("--width", type=multiple_of_8, default=width, help=f"input width (default {width})")


def add_threads(parser: argparse.ArgumentParser, what: str = "torch intra-op threads") -> None:
    parser.add_argument("--threads", type=positive_int, default=THREADS, help=f"{what} (default {THREADS})")


def add_run_protocol_options(parser: argparse.ArgumentParser, *, repeats: int, warmup: int) -> None:
    """``--threads``, ``--repeats``, ``--warmup`` and ``--runs`` (at least 3)."""
    add_threads(parser)
    parser.add_argument("--repeats", type=positive_int, default=repeats, help="timed calls per variant and run")
    parser.add_argument("--warmup", type=positive_int, default=warmup, help="untimed calls per variant and run")
    parser.add_argument("--runs", type=int_at_least(3), default=3, help="independent timed runs, each in a rotated "
                                                                       "order (default and minimum 3)")


def add_load_test_options(parser: argparse.ArgumentParser) -> None:
    """A bounded loopback load test's options, with the same defaults wherever one runs."""
    add_input_size(parser, SMALL_SIZE)
    parser.add_argument("--concurrency", type=positive_int_list, default="1,2,4,8",
                        help="client counts to try (default 1,2,4,8)")
    parser.add_argument("--requests", type=positive_int, default=24, help="requests per level, at least 4 per client")
    parser.add_argument("--time-limit", type=positive_int, default=60, help="seconds per level at most (default 60)")
    parser.add_argument("--max-queue", type=positive_int, default=8, help="the book server's queue bound (default 8)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the batcher's wait for company (default 5)")
    parser.add_argument("--overload-clients", type=int_at_least(0), default=24,
                        help="clients of the last level, beyond the queue bound (0 skips it; default 24)")
    add_threads(parser, "intra-op threads")


def check_load_test(parser: argparse.ArgumentParser, args, *, queue_bound: bool = True) -> None:
    """Refuse over 64 clients a level, a wait outside 0..1000 ms, and (``queue_bound``) a level above the bound."""
    if max(args.concurrency) > 64 or args.overload_clients > 64:
        parser.error("at most 64 clients per level")
    if queue_bound and max(args.concurrency) > args.max_queue:
        parser.error(f"--concurrency levels must not exceed --max-queue ({args.max_queue}); only the overload level does")
    if not 0 <= args.max_wait_ms <= 1000:
        parser.error(f"--max-wait-ms must be in 0..1000, got {args.max_wait_ms:g}")


def exit_status_for(prog: str, failed_variants) -> int:
    """1 with one stderr line naming ``failed_variants`` (after their rows are written), else 0."""
    failed = list(dict.fromkeys(failed_variants))
    if failed:
        print(f"{prog}: failed its correctness check against eager: {', '.join(map(str, failed))}", file=sys.stderr)
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def resource_absent(prog: str, message: str) -> int:
    """Say in one stderr line why the script cannot run here; exit status 3."""
    print(f"{prog}: {message}", file=sys.stderr)
    return EXIT_RESOURCE_ABSENT
