"""A matrix of ONNX Runtime static INT8 quantization choices, scored where it matters."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
from onnxruntime.quantization import qdq_loss_debug as qld
from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

from graphbook.config import THREADS
from graphbook.measure import timing
from graphbook.model.blurball import imagenet_normalize
from graphbook.model.decoding import decode_batch
from graphbook.model.scoring import match_detections, summarize_matches
from graphbook.model.synthetic_clips import frames_to_tensor
from graphbook.runtimes.onnx_utils import make_session
from graphbook.int8.quantization import (Int8Config, calibration_reader, module_of, node_group, node_scopes,
                                         quantize_config, quiet_onnxruntime)

#: Result kinds (``graphbook.record.results.KINDS``) this module's rows are written as.
KIND_MATRIX = "int8-matrix"
KIND_TENSOR_ERRORS = "int8-tensor-errors"

FP32_NAME = "fp32"
#: Column of the largest logit difference from the FP32 model (the book's one name for it).
MAX_ABS_DIFF = "max_abs_diff"


# ---- Scoring and timing
def clip_inputs(clips) -> list[np.ndarray]:
    """One ImageNet-normalised ``(1, 9, H, W)`` float32 input per clip, as in training (Chapter 4)."""
    return [imagenet_normalize(frames_to_tensor(clip)).numpy().astype(np.float32) for clip in clips]


def _score_outputs(logits: Sequence[np.ndarray], clips, reference: Sequence[np.ndarray] | None = None) -> dict:
    """Score per-clip logits ``(1, 3, H, W)`` against the clips' labels, and against reference logits (Chapter 4)."""
    decoded = [frames for out in logits for frames in decode_batch(out)]
    summary = summarize_matches(match_detections(decoded, list(clips)))
    diff = math.nan
    if reference is not None:
        diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                   for a, b in zip(logits, reference))
    return {**summary, MAX_ABS_DIFF: diff}


# ---- The matrix
@dataclass
class MatrixRun:
    """What :func:`run_matrix` measured: one row per model (FP32 first), and the failures by name (Chapter 4)."""

    rows: list[dict] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)


def run_matrix(fp32_path: str | Path, configs: Sequence[Int8Config], calibration_frames: Sequence, eval_clips,
               *, workdir: str | Path, threads: int = THREADS, repeats: int = 5,
               log: Callable[[str], object] | None = None) -> MatrixRun:
    """Quantize, score and time every configuration, with the FP32 model as the reference row (Chapter 4)."""
    say = log or (lambda message: None)
    workdir = Path(workdir)
    inputs = clip_inputs(eval_clips)
    height, width = inputs[0].shape[-2:]
    run = MatrixRun()
    sessions = {}

    def infer(session):
        name = session.get_inputs()[0].name
        return [session.run(None, {name: x})[0] for x in inputs]

    fp32_session = make_session(fp32_path, threads=threads)
    reference = infer(fp32_session)
    sessions[FP32_NAME] = fp32_session
    fp32_row = {"config": FP32_NAME, "role": "reference", "precision": "fp32",
                **dict.fromkeys(("per_channel", "calibration", "histogram_bins", "pre_process", "excluded",
                                 "reduce_range"), ""), "status": "ok", "quantize_s": 0.0, "excluded_nodes": 0,
                "quantize_nodes": 0, **_score_outputs(reference, eval_clips, reference)}
    run.rows.append(fp32_row)
    run.paths[FP32_NAME] = Path(fp32_path)
    say(f"fp32: detection rate {fp32_row['detection_rate']:.3f}")
    for config in configs:
        row = {"config": config.name, "role": config.role, "precision": "int8", "per_channel": config.per_channel,
               "calibration": config.calibration, "histogram_bins": config.histogram_bins or "",
               "pre_process": config.pre_process, "excluded": config.excluded,
               "reduce_range": config.reduce_range, "status": "ok"}
        try:
            built = quantize_config(fp32_path, workdir / f"int8_{config.name}.onnx", config, calibration_frames)
            session = make_session(built["path"], threads=threads)
            logits = infer(session)
        except Exception as error:  # a configuration that cannot be built or run is a result, not a crash
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            row["status"] = message
            run.failures[config.name] = message
            run.rows.append(row)
            say(f"{config.name}: FAILED ({message})")
            continue
        row.update({"quantize_s": built["quantize_s"], "excluded_nodes": built["excluded_nodes"],
                    "quantize_nodes": built["quantize_nodes"], **_score_outputs(logits, eval_clips, reference)})
        sessions[config.name] = session
        run.paths[config.name] = built["path"]
        run.rows.append(row)
        say(f"{config.name}: detection rate {row['detection_rate']:.3f}, max abs diff {row['max_abs_diff']:.3g}")

    feed_name = fp32_session.get_inputs()[0].name
    times = {name: t.as_dict() for name, t in timing.interleaved(
        {name: (lambda s=s: s.run(None, {feed_name: inputs[0]})) for name, s in sessions.items()},
        warmup=1, repeats=repeats).items()}
    for row in run.rows:  # a configuration that failed has no times: NaN
        timed = times.get(row["config"], {})
        row.update({"height": int(height), "width": int(width), "threads": threads, "timing_runs": repeats,
                    "calibration_clips": len(calibration_frames), "eval_clips": len(eval_clips),
                    "latency_ms": timed.get("median_ms", math.nan), "latency_min_ms": timed.get("min_ms", math.nan),
                    "latency_max_ms": timed.get("max_ms", math.nan), "latency_times_ms": timed.get("times_ms", ()),
                    "speedup_vs_fp32": times[FP32_NAME]["median_ms"] / timed.get("median_ms", math.nan)})
    return run


# ---- Which tensors quantize worst (onnxruntime.quantization.qdq_loss_debug)
def _sqnr_db(reference, candidate) -> float:
    """Signal-to-quantization-noise ratio in dB (``qdq_loss_debug``'s), NaN when the reference is all zero."""
    values = [reference] if isinstance(reference, np.ndarray) else list(reference)
    if not values or float(np.linalg.norm(np.concatenate([np.ravel(v) for v in values]))) <= 1e-12:
        return math.nan
    return float(compute_signal_to_quantization_noice_ratio(reference, candidate))


def _where(node) -> dict:
    """The module, layer group and operator of the node that produces or reads a tensor ("" when none)."""
    if node is None:
        return {"module": "", "group": "other", "op": ""}
    scopes = node_scopes(node)
    return {"module": module_of(scopes), "group": node_group(scopes) or "other", "op": node.op_type}


def tensor_errors(fp32_path: str | Path, qdq_path: str | Path, frames: Sequence, *, workdir: str | Path,
                  top: int = 10) -> list[dict]:
    """The ``top`` worst-quantized activations and weights of a Q/DQ model, ranked by SQNR (Chapter 4)."""
    fp32_path, qdq_path, workdir = Path(fp32_path), Path(qdq_path), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    graph = onnx.load(str(fp32_path), load_external_data=False).graph
    produced = {name: node for node in graph.node for name in node.output}
    consumed = {}
    for node in graph.node:
        for name in node.input:
            consumed.setdefault(name, node)

    with quiet_onnxruntime():
        activations = {}
        for label, path in (("float", fp32_path), ("qdq", qdq_path)):
            augmented = workdir / f"debug_{label}_{path.stem}.onnx"
            qld.modify_model_output_intermediate_tensors(str(path), str(augmented))
            activations[label] = qld.collect_activations(str(augmented), calibration_reader(graph.input[0].name, frames))
        matched = qld.create_activation_matching(activations["qdq"], activations["float"])
        matched = {name: m for name, m in matched.items() if m.get("float")}
        for name, match in matched.items():
            node = produced.get(name)
            if node is not None and node.op_type == "Relu":  # the Q/DQ model dropped it (its range clips at 0)
                match["pre_qdq"] = [np.maximum(a, 0) for a in match["pre_qdq"]]
        act_err = qld.compute_activation_error(matched, err_func=_sqnr_db)
        weight_err = qld.compute_weight_error(qld.create_weight_matching(str(fp32_path), str(qdq_path)))
    rows = []
    finite = [(name, err) for name, err in act_err.items() if not math.isnan(err["qdq_err"])]
    for rank, (name, err) in enumerate(sorted(finite, key=lambda item: item[1]["qdq_err"])[:top], 1):
        rows.append({"tensor_kind": "activation", "rank": rank, "tensor": name,
                     **_where(produced.get(name) or consumed.get(name)), "sqnr_db": err["qdq_err"],
                     "qdq_sqnr_db": err["qdq_err"], "xmodel_sqnr_db": err.get("xmodel_err", math.nan)})
    for rank, (name, err) in enumerate(sorted(weight_err.items(), key=lambda item: item[1])[:top], 1):
        where = _where(consumed.get(name))
        module, _, kind = name.rpartition(".")
        rows.append({"tensor_kind": "weight", "rank": rank, "tensor": name, **where,
                     "module": module if kind in ("weight", "bias") and module else where["module"], "sqnr_db": err,
                     "qdq_sqnr_db": math.nan, "xmodel_sqnr_db": math.nan})
    return rows
