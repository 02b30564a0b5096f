"""Training BlurBall on synthetic clips on a CPU: the loss, validation and the run behind code/train_blurball.py."""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball, decoding, model_cost, scoring, synthetic_clips
from graphbook.record import results


def _output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Checkpoint, log and provenance paths under ``name``, ``name-2``...: a second run never overwrites the first."""
    suffixes = {"checkpoint": ".pt", "log": ".log.csv", "provenance": ".provenance.json"}
    stem = results._unique_path(out_dir, name, *suffixes.values()).name.removesuffix(".pt")
    return {key: out_dir / f"{stem}{suffix}" for key, suffix in suffixes.items()}


def _line_loss(logits, target, kind: str = "weighted-mse", pos_weight: float = 20.0):
    """MSE of the clamped sigmoid to the line target; ``"weighted-mse"`` weighs target pixels by ``pos_weight``."""
    prob = torch.sigmoid(logits.float()).clamp(1e-4, 1 - 1e-4)
    err = (prob - target) ** 2
    if kind == "mse":
        return err.mean()
    weight = 1.0 + (pos_weight - 1.0) * target
    return (weight * err).sum() / weight.sum()


def _validation_metrics(model, clips_list, args) -> dict:
    """Loss, detection rate, median error and mean output on target / background pixels, from one forward each."""
    model.eval()
    decoded, losses, pos, neg, npos, nneg = [], [], 0.0, 0.0, 0, 0
    try:
        with torch.no_grad():
            for start in range(0, len(clips_list), args.batch_size):
                chunk = clips_list[start:start + args.batch_size]
                logits = model(blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(chunk)))
                target = synthetic_clips.targets_to_tensor(chunk)
                decoded.extend(decoding.decode_batch(logits))
                losses.append(float(_line_loss(logits, target, args.loss, args.pos_weight)) * len(chunk))
                prob = torch.sigmoid(logits)
                pos += float((prob * target).sum())
                neg += float((prob * (1 - target)).sum())
                npos += int(target.sum())
                nneg += int((1 - target).sum())
    finally:
        model.train()
    summary = scoring.summarize_matches(scoring.match_detections(decoded, clips_list))
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
    """Train as ``code/train_blurball.py``'s ``args`` say; write checkpoint, log and provenance; return the record."""
    started = time.time()
    deadline = started + args.minutes * 60.0
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    paths = _output_paths(args.checkpoint_dir, args.name)  # creates the folder
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
            loss = _line_loss(logits, synthetic_clips.targets_to_tensor(batch), args.loss, args.pos_weight)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            step += 1
            samples += args.batch_size
            if args.max_steps is not None and step >= args.max_steps:
                break
        epoch += 1
        metrics = _validation_metrics(model, val_clips, args)
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
    for clips, (height, width), batch_size, options in (
            (args.final_val_clips, (args.height, args.width), args.batch_size, {"max_speed": args.max_speed}),
            (args.full_eval_clips, synthetic_clips.FULL_SIZE, 1, {})):
        if clips:
            held_out = synthetic_clips.held_out_clips(clips, height, width, **options)
            summary, _ = scoring.evaluate_model(model, held_out, batch_size=batch_size)
            final[f"{height}x{width}"] = {"clips": clips, **summary}
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
        "parameters": model_cost.parameter_count(model),
        "final_metrics": final, "last_epoch": history[-1] if history else None,
        "hit_px": scoring.DEFAULT_HIT_PX, "held_out_seed": synthetic_clips.HELD_OUT_SEED,
        "notes": ("Trained on synthetic clips from graphbook.model.synthetic_clips at the full-resolution pixel scale, "
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
