"""Train BlurBall on synthetic clips on a CPU, within a time budget, from a fixed seed."""
from __future__ import annotations

import sys

from graphbook import paths
from graphbook.config import SMALL_SIZE
from graphbook.model import training
from graphbook.record import cli
from graphbook.record.cli import int_at_least, positive_float

DEFAULT_CHECKPOINT_DIR = paths.CHECKPOINT_DIR
DEFAULT_NAME = "blurball_synthetic"


def parse_args(argv=None):
    # No --results-dir: training writes no results table, only a checkpoint with its log and provenance.
    p = cli.make_parser("train_blurball.py", "Train BlurBall on synthetic table-tennis clips on a CPU (Chapter 6).",
                        results_dir=False)
    p.add_argument("--minutes", type=positive_float, default=36.0,
                   help="wall-time budget for training and per-epoch validation (the final evaluation comes after)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the model init and the training clips")
    p.add_argument("--checkpoint-dir", type=cli.directory, default=DEFAULT_CHECKPOINT_DIR, metavar="DIR",
                   help="where the checkpoint, its log and provenance go (default data/checkpoints)")
    p.add_argument("--name", default=DEFAULT_NAME, help="file stem of the outputs")
    cli.add_input_size(p, SMALL_SIZE)
    p.add_argument("--max-speed", type=positive_float, default=30.0,
                   help="fastest ball in px per frame (the full-size clips' default, so blur lengths match)")
    p.add_argument("--batch-size", type=int_at_least(1), default=4)
    p.add_argument("--val-clips", type=int_at_least(1), default=24, help="held-out clips scored after each epoch")
    p.add_argument("--final-val-clips", type=int_at_least(0), default=64,
                   help="held-out clips at the training size scored at the end (0: skip)")
    p.add_argument("--full-eval-clips", type=int_at_least(0), default=8,
                   help="held-out clips at 288 x 512 scored at the end (0: skip)")
    p.add_argument("--epoch-steps", type=int_at_least(1), default=20, help="optimiser steps per epoch")
    p.add_argument("--max-steps", type=int_at_least(1), default=None, help="stop after this many steps")
    p.add_argument("--threads", type=int_at_least(1), default=1,
                   help="torch threads (1: on a busy machine extra threads mostly wait for each other)")
    p.add_argument("--autocast", choices=("bf16", "none"), default="bf16",
                   help="bf16 autocast for the forward pass (weights and optimiser stay float32)")
    p.add_argument("--lr", type=positive_float, default=3e-4)
    p.add_argument("--loss", choices=("weighted-mse", "mse"), default="weighted-mse")
    p.add_argument("--pos-weight", type=positive_float, default=20.0, help="weight of target pixels (weighted-mse)")
    p.add_argument("--prior", type=positive_float, default=0.05, help="initial sigmoid output of the head (< 1)")
    args = p.parse_args(argv)
    if args.height < 32 or args.width < 32:
        p.error(f"--height and --width must be at least 32, got {args.height}x{args.width}")
    if args.prior >= 1:
        p.error(f"--prior must be below 1, got {args.prior}")
    if not args.name or any(c in args.name for c in "/\\") or args.name.startswith("."):
        p.error(f"--name must be a plain file stem, got {args.name!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        training.train(args)
    except OSError as exc:  # e.g. an output directory that cannot be created or written
        print(f"train_blurball.py: error: {exc.strerror or exc} ({exc.filename or ''})", file=sys.stderr)
        return cli.EXIT_USAGE
    except KeyboardInterrupt:
        print("train_blurball.py: interrupted; no checkpoint written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
