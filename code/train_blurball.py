"""Train BlurBall on synthetic clips on a CPU, within a time budget, from a fixed seed.

Introduced in Chapter 6. The book needs a BlurBall that finds the ball, so that "does the compiled
model keep the ball positions?" can be answered against ground truth. The authors' weights are not
redistributable here, so this script trains the re-implementation (``graphbook.blurball``) on the
synthetic clips of ``graphbook.synthetic_clips``.

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
``<out-dir>/<name>.pt`` (``{"model_state_dict": ...}``, float32, about 6 MB),
``<out-dir>/<name>.log.csv`` (one row per epoch: loss, validation detection rate and error) and
``<out-dir>/<name>.provenance.json`` (seed, git commit, date, machine, arguments, wall time, metrics).

Example (the book's checkpoint): ``nice -n 10 python code/train_blurball.py --seed 0``. Bad arguments exit with status 2
and one line on stderr.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_OUT_DIR = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
DEFAULT_NAME = "blurball_synthetic"


class UsageError(Exception):
    """A bad command-line argument: reported as one line on stderr, exit status 2."""


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage block or traceback
        print(f"train_blurball.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(description="Train BlurBall on synthetic table-tennis clips on a CPU (Chapter 6).")
    p.add_argument("--minutes", type=_positive_float, default=36.0,
                   help="wall-time budget for training and per-epoch validation (the final evaluation comes after)")
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the model init and the training clips")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the checkpoint, log and provenance go")
    p.add_argument("--name", default=DEFAULT_NAME, help="file stem of the outputs")
    p.add_argument("--height", type=_int_at_least(32), default=96, help="training clip height (multiple of 8)")
    p.add_argument("--width", type=_int_at_least(32), default=160, help="training clip width (multiple of 8)")
    p.add_argument("--max-speed", type=_positive_float, default=30.0,
                   help="fastest ball in px per frame (the full-size clips' default, so blur lengths match)")
    p.add_argument("--batch-size", type=_int_at_least(1), default=4)
    p.add_argument("--val-clips", type=_int_at_least(1), default=24, help="held-out clips scored after each epoch")
    p.add_argument("--final-val-clips", type=_int_at_least(0), default=64,
                   help="held-out clips at the training size scored at the end (0: skip)")
    p.add_argument("--full-eval-clips", type=_int_at_least(0), default=8,
                   help="held-out clips at 288 x 512 scored at the end (0: skip)")
    p.add_argument("--epoch-steps", type=_int_at_least(1), default=20, help="optimiser steps per epoch")
    p.add_argument("--max-steps", type=_int_at_least(1), default=None, help="stop after this many steps")
    p.add_argument("--threads", type=_int_at_least(1), default=1,
                   help="torch threads (1: on a busy machine extra threads mostly wait for each other)")
    p.add_argument("--autocast", choices=("bf16", "none"), default="bf16",
                   help="bf16 autocast for the forward pass (weights and optimiser stay float32)")
    p.add_argument("--lr", type=_positive_float, default=3e-4)
    p.add_argument("--loss", choices=("weighted-mse", "mse"), default="weighted-mse")
    p.add_argument("--pos-weight", type=_positive_float, default=20.0, help="weight of target pixels (weighted-mse)")
    p.add_argument("--prior", type=_positive_float, default=0.05, help="initial sigmoid output of the head (< 1)")
    return p


def check_args(args) -> None:
    """Raise :class:`UsageError` for arguments that parse but make no sense together."""
    for name in ("height", "width"):
        if getattr(args, name) % 8:
            raise UsageError(f"--{name} must be a multiple of 8 (BlurBall halves it three times), got {getattr(args, name)}")
    if args.prior >= 1:
        raise UsageError(f"--prior must be below 1, got {args.prior}")
    if not args.name or any(c in args.name for c in "/\\") or args.name.startswith("."):
        raise UsageError(f"--name must be a plain file stem, got {args.name!r}")
    if args.out_dir.exists() and not args.out_dir.is_dir():
        raise UsageError(f"--out-dir {args.out_dir} exists and is not a directory")


def output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Checkpoint, log and provenance paths under a stem none of whose three files exists yet."""
    suffixes = {"checkpoint": ".pt", "log": ".log.csv", "provenance": ".provenance.json"}
    for k in range(1, 10_000):
        stem = name if k == 1 else f"{name}-{k}"
        paths = {key: out_dir / f"{stem}{suffix}" for key, suffix in suffixes.items()}
        if not any(p.exists() for p in paths.values()):
            return paths
    raise UsageError(f"no free output name for {name!r} in {out_dir}")


def line_loss(logits, target, kind: str = "weighted-mse", pos_weight: float = 20.0):
    """The training loss: MSE between the clamped sigmoid and the line target, optionally weighted.

    Introduced in Chapter 6. ``kind="mse"`` is the spec's loss; ``"weighted-mse"`` multiplies the
    squared error of target pixels by ``pos_weight`` (see the module docstring for why).
    """
    import torch

    prob = torch.sigmoid(logits.float()).clamp(1e-4, 1 - 1e-4)
    err = (prob - target) ** 2
    if kind == "mse":
        return err.mean()
    if kind == "weighted-mse":
        weight = 1.0 + (pos_weight - 1.0) * target
        return (weight * err).sum() / weight.sum()
    raise ValueError(f"unknown loss {kind!r}; expected 'weighted-mse' or 'mse'")


def validation_metrics(model, clips_list, args) -> dict:
    """Loss, detection rate, median error and mean output on target / background pixels (Chapter 6)."""
    import torch
    from graphbook import blurball, scoring, synthetic_clips

    model.eval()
    try:
        summary, _ = scoring.evaluate_model(model, clips_list, batch_size=args.batch_size)
        with torch.no_grad():
            losses, pos, neg, npos, nneg = [], 0.0, 0.0, 0, 0
            for start in range(0, len(clips_list), args.batch_size):
                chunk = clips_list[start:start + args.batch_size]
                logits = model(blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(chunk)))
                target = synthetic_clips.targets_to_tensor(chunk)
                losses.append(float(line_loss(logits, target, args.loss, args.pos_weight)) * len(chunk))
                prob = torch.sigmoid(logits)
                pos += float((prob * target).sum())
                neg += float((prob * (1 - target)).sum())
                npos += int(target.sum())
                nneg += int((1 - target).sum())
    finally:
        model.train()
    return {"val_loss": sum(losses) / len(clips_list), "val_detection_rate": summary["detection_rate"],
            "val_median_error_px": summary["median_error_px"],
            "val_false_positive_rate": summary["false_positive_rate"],
            "val_mean_prob_target": pos / max(npos, 1), "val_mean_prob_background": neg / max(nneg, 1)}


def _json_ready(value):
    """Plain JSON: NaN and infinities become null (strict JSON has no NaN), numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def train(args) -> dict:
    """Run the training described by parsed ``args``; return the provenance record (Chapter 6)."""
    import numpy as np
    import torch
    from graphbook import blurball, results, scoring, synthetic_clips
    from graphbook.environment import fingerprint, set_threads

    started = time.time()
    deadline = started + args.minutes * 60.0
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    paths = output_paths(args.out_dir, args.name)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    env = fingerprint(args.threads)

    model = blurball.build_blurball(seed=args.seed, heatmap_only=True)
    with torch.no_grad():  # start the head at a small prior probability, not at 0.5
        model.final_layers[0].bias.fill_(math.log(args.prior / (1 - args.prior)))
    model.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    val_clips = synthetic_clips.held_out_clips(args.val_clips, args.height, args.width, max_speed=args.max_speed)

    step, epoch, samples, next_clip = 0, 0, 0, 0
    epoch_seconds = []
    history = []
    while True:
        epoch_start = time.time()
        losses = []
        for _ in range(args.epoch_steps):
            batch = [synthetic_clips.training_clip(args.seed, next_clip + k, args.height, args.width,
                                                   max_speed=args.max_speed)
                     for k in range(args.batch_size)]
            next_clip += args.batch_size
            x = blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(batch))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
                logits = model(x)
            loss = line_loss(logits, synthetic_clips.targets_to_tensor(batch), args.loss, args.pos_weight)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            step += 1
            samples += args.batch_size
            if args.max_steps is not None and step >= args.max_steps:
                break
        epoch += 1
        metrics = validation_metrics(model, val_clips, args)
        epoch_seconds.append(time.time() - epoch_start)
        row = {"epoch": epoch, "step": step, "samples": samples, "elapsed_s": round(time.time() - started, 1),
               "train_loss": float(np.mean(losses)), **metrics, "lr": args.lr,
               "height": args.height, "width": args.width, "batch_size": args.batch_size, "seed": args.seed}
        results.append_rows(paths["log"], [row])
        history.append(row)
        print(f"epoch {epoch} step {step} loss {row['train_loss']:.4f} val_loss {metrics['val_loss']:.4f} "
              f"det {metrics['val_detection_rate']:.2f} err {metrics['val_median_error_px']:.2f}px "
              f"fp {metrics['val_false_positive_rate']:.2f} p(target) {metrics['val_mean_prob_target']:.3f} "
              f"p(bg) {metrics['val_mean_prob_background']:.4f} [{row['elapsed_s']:.0f}s]", flush=True)
        if args.max_steps is not None and step >= args.max_steps:
            break
        if time.time() + max(epoch_seconds[-3:]) * 1.1 > deadline:  # the next epoch would overrun the budget
            break
    train_seconds = time.time() - started

    model.eval()
    blurball.save_weights(model, paths["checkpoint"])
    final = {}
    if args.final_val_clips:
        held_out = synthetic_clips.held_out_clips(args.final_val_clips, args.height, args.width,
                                                  max_speed=args.max_speed)
        summary, _ = scoring.evaluate_model(model, held_out, batch_size=args.batch_size)
        final[f"{args.height}x{args.width}"] = {"clips": args.final_val_clips, **summary}
    if args.full_eval_clips:
        full_height, full_width = synthetic_clips.FULL_SIZE
        held_out = synthetic_clips.held_out_clips(args.full_eval_clips, full_height, full_width)
        summary, _ = scoring.evaluate_model(model, held_out, batch_size=1)
        final[f"{full_height}x{full_width}"] = {"clips": args.full_eval_clips, **summary}
    checkpoint_bytes = paths["checkpoint"].stat().st_size
    record = {
        "checkpoint": paths["checkpoint"].name, "log": paths["log"].name,
        "checkpoint_bytes": checkpoint_bytes,
        "checkpoint_sha256": hashlib.sha256(paths["checkpoint"].read_bytes()).hexdigest(),
        "seed": args.seed, "git_commit": env["git_commit"], "date": env["date"],
        "machine": {k: env[k] for k in ("cpu_model", "cpu_cores", "threads", "platform", "python", "torch")},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "steps": step, "epochs": epoch, "samples_seen": samples,
        "train_wall_seconds": round(train_seconds, 1), "total_wall_seconds": round(time.time() - started, 1),
        "parameters": blurball.parameter_count(model),
        "final_metrics": final, "last_epoch": history[-1] if history else None,
        "hit_px": scoring.DEFAULT_HIT_PX, "held_out_seed": synthetic_clips.HELD_OUT_SEED,
        "notes": ("Trained on synthetic clips from graphbook.synthetic_clips at the full-resolution pixel scale, "
                  f"as crops of {args.height}x{args.width} (BlurBall is fully convolutional; a full-size sample costs "
                  "too much on a CPU). Loss: " + ("spec MSE on the clamped sigmoid." if args.loss == "mse" else
                  f"MSE on the clamped sigmoid with target pixels weighted x{args.pos_weight} (plain MSE "
                  "collapses to all-zero heatmaps with about 1% positive pixels).")),
    }
    record = _json_ready(record)
    paths["provenance"].write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    print(f"saved {paths['checkpoint']} ({checkpoint_bytes / 1e6:.1f} MB), {paths['log'].name}, "
          f"{paths['provenance'].name}; final: {json.dumps(record['final_metrics'])}", flush=True)
    return record


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        train(args)
    except UsageError as exc:
        print(f"train_blurball.py: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an output directory that cannot be created or written
        print(f"train_blurball.py: error: {exc.strerror or exc} ({exc.filename or ''})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("train_blurball.py: interrupted; no checkpoint written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
