"""Train BlurBall on synthetic clips on a CPU, within a time budget, from a fixed seed.

Introduced in Chapter 6. The book needs a BlurBall that finds the ball, so that "does the compiled
model keep the ball positions?" can be answered against ground truth. The authors' weights are not
redistributable here, so this script trains the re-implementation (``graphbook.model.blurball``) on the
synthetic clips of ``graphbook.model.synthetic_clips``.

Why small crops: BlurBall costs about 190 k multiply-accumulates per input pixel and its top branch
runs at full resolution, so one training sample at 288 x 512 costs tens of seconds on a laptop CPU
core. The network is fully convolutional (its only global operation is the SE blocks' average
pooling), so it can be trained on small clips (default 96 x 160) drawn at the full-resolution pixel
scale: the ball, its blur and the textures have the sizes they have in a 288 x 512 frame, and a
96 x 160 clip looks like a crop of one. The trained weights then run at any size that is a multiple
of 8, including 288 x 512. The SE pooling sees a smaller area in training than at full size; the
full-size evaluation at the end measures what that costs.

Loss: the spec's loss is the MSE between the clamped sigmoid of the logits and the line target. With
about one positive pixel in a hundred, plain MSE drives every output to 0 (the positive pixels'
gradient vanishes with the sigmoid), so the default is a weighted MSE: positive pixels weigh
``--pos-weight`` times more (``--loss mse`` gives the spec's unweighted loss). The head's bias starts
at the logit of ``--prior`` so the first steps do not spend themselves pushing the background down.
Adam with learning rate 3e-4, as the authors' configuration.

Speed: the forward pass runs under bf16 autocast by default (``--autocast none`` for float32); the
weights, the optimiser and the saved checkpoint stay float32, and validation runs in float32. One
thread is the default: on a shared 2-core machine a two-thread step took about ten times the CPU
time of a one-thread step, because OpenMP threads spin while waiting for each other.

Outputs (never overwriting; a name that exists gets a -2, -3 ... suffix):
``<checkpoint-dir>/<name>.pt`` (``{"model_state_dict": ...}``, float32, about 6 MB),
``<checkpoint-dir>/<name>.log.csv`` (one row per epoch: loss, validation detection rate and error) and
``<checkpoint-dir>/<name>.provenance.json`` (seed, git commit, date, machine, arguments, wall time, metrics).

Example (the book's checkpoint): ``nice -n 10 python code/train_blurball.py --seed 0``. This file is the
command line; the loss, validation and training loop are ``graphbook.model.training``. Bad arguments exit
with status 2 and one line on stderr (``graphbook.record.cli``).
"""
from __future__ import annotations

import sys

from graphbook import paths
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
    cli.add_input_size(p, height=96, width=160)
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
