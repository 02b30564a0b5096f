"""Chapter 6's table: every variant this machine can run, its logits against eager FP32's and its decoded balls
against eager's and against the ground truth, on the same held-out clips."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import torch

from graphbook import checks
from graphbook.config import THREADS
from graphbook.method import variants
from graphbook.model import scoring
from graphbook.model.ball import DEFAULT_AGREE_PX, clip_inputs, decoded, detections_agree
from graphbook.record import results
from graphbook.runtimes.onnx_utils import LEVEL_NAMES

#: The variants of the correctness table, from :data:`graphbook.method.variants.REGISTRY` (keyed by their labels).
TORCH_VARIANTS = ("eager_fp32", "compile_default", "compile_freezing", "eager_bf16_autocast",
                  "eager_fp32_channels_last")


def correctness_table(runners: dict[str, Callable], clips: list, *, reference: str = "eager FP32",
                      batch_size: int = 1, threshold: float = 0.5, agree_px: float = DEFAULT_AGREE_PX) -> list[dict]:
    """One row per variant: logits vs ``reference`` and detections vs reference and ground truth (Chapter 6)."""
    if reference not in runners:
        raise ValueError(f"reference variant {reference!r} is not among {sorted(runners)}")
    if not clips:
        raise ValueError("need at least one held-out clip")
    inputs = clip_inputs(clips, batch_size)
    with torch.no_grad():
        outputs = {name: [run(x).float() for x in inputs] for name, run in runners.items()}
    decodings = {name: decoded(outs, threshold) for name, outs in outputs.items()}
    rows = []
    for name in runners:
        compared = [checks.compare_to_reference(o, r) for o, r in zip(outputs[name], outputs[reference])]
        diff = max(c[results.MAX_ABS_DIFF] for c in compared)
        try:
            expected = variants.by_label(name).expected_to_match_eager
        except ValueError:
            expected = None
        agree, frames, shift = detections_agree(decodings[name], decodings[reference], agree_px)
        truth = scoring.summarize_matches(scoring.match_detections(decodings[name], clips))
        rows.append({"variant": name, "clips": len(clips), "frames": frames, results.MAX_ABS_DIFF: diff,
                     results.SAME_OUTPUT: all(c[results.SAME_OUTPUT] for c in compared),
                     results.EXPECTED_TO_MATCH: expected,
                     "agree_frames": int(agree), "agree_share": agree / frames, "max_shift_px": float(shift),
                     **{key: float(truth[key]) for key in ("detection_rate", "median_error_px",
                                                           "median_angle_error_deg", "false_positive_rate")}})
    return rows


def all_variants(model: torch.nn.Module, example_clip, *, onnx: bool = True, calibration_clips: list | None = None,
                 threads: int = THREADS, workdir: str | Path | None = None) -> dict[str, Callable]:
    """Every variant this machine can run, eager FP32 first (Chapter 6)."""
    runners = variants.runners(model.eval(), None, TORCH_VARIANTS)  # keyed by label, eager FP32 first
    if onnx and variants.onnx_available()[0]:
        names = [f"ort_{level}" for level in LEVEL_NAMES] + (["ort_int8_qdq_all"] if calibration_clips else [])
        # without a workdir the files go once the sessions are built (sessions hold their model in memory)
        with tempfile.TemporaryDirectory(prefix="graphbook-onnx-") as scratch:
            context = variants.BuildContext(workdir=workdir if workdir is not None else scratch, threads=threads,
                                            calibration=clip_inputs(calibration_clips or []) or None)
            onnx_runners = variants.runners(model, clip_inputs([example_clip])[0], names, context, skip_unavailable=False)
        onnx_runners.pop(variants.get(variants.REFERENCE).label)
        runners.update(onnx_runners)
    return runners
