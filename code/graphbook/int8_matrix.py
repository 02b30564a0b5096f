"""A matrix of ONNX Runtime static INT8 quantization choices, scored where it matters.

Introduced in Chapter 4. Chapter 4's first INT8 model (:func:`graphbook.onnx_utils.quantize_qdq`) is one
choice among many: weights per output channel or per tensor; activation ranges from MinMax, Entropy or
Percentile calibration; the model pre-processed by ``onnxruntime.quantization.shape_inference.quant_pre_process``
or not; every layer quantized, or the sensitive ones (the stem that sees the raw frames, the 1x1 head
that writes the logits, the squeeze-and-excitation gates) kept in FP32; and ``reduce_range`` (7-bit
weights), which :func:`graphbook.onnx_utils.int8_settings_for` chooses for this CPU (on x86 without
VNNI the u8 x s8 products saturate otherwise). This module builds those models, scores each on the
*held-out* synthetic clips against their ground truth (detection rate, median position error, median
blur-angle error; :mod:`graphbook.scoring`) and against the FP32 model's logits (max abs diff), times
them, and lets ONNX Runtime's Q/DQ debugging helpers (``onnxruntime.quantization.qdq_loss_debug``)
name the tensors that quantize worst.

The design is fractional, not the full 2 x 4 x 2 x 5 x 2 = 160-model product (half a minute to a
minute of a shared 2-core CPU each, counting calibration, scoring and timing): :func:`design` varies
**one factor at a time** from a baseline (per-channel, MinMax, no pre-processing, everything
quantized, ``reduce_range`` as chosen for this CPU), which measures each factor's main effect, and
adds two **combinations** (the "careful" choice on every factor at once, and per-tensor weights with
the sensitive layers excluded) to show whether the effects add up. Interactions beyond those two are
not estimated. The calibration factor has four levels, because ``quantize_static``'s Entropy is
MinMax in disguise: it builds its histogram with 128 bins, as many as the 128 quantized bins the
entropy search slides over them, so the search has one candidate, the full range (the first
recorded run shows identical scales); a real entropy calibration needs more bins, which only a
calibration cache can hand to ``quantize_static`` (:class:`Int8Config`, ``histogram_bins``).

Entry points for Chapter 4: :func:`design`, :func:`run_matrix` (what ``code/bench_int8.py`` calls),
:func:`tensor_errors`, :func:`latest_matrix` / :func:`latest_tensor_errors` (the newest recorded run),
:func:`combined_matrix` (every recorded run of this machine, latency as the median across runs),
:func:`matrix_table`, :func:`describe_tensor_errors`, and :func:`recommend_int8_config`, which chooses a configuration from a recorded
run by data and says why.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .record import timing

#: The calibration methods of ``onnxruntime.quantization.CalibrationMethod`` the matrix compares.
CALIBRATIONS = ("MinMax", "Entropy", "Percentile")
#: The layer groups that can be kept in FP32 (see :func:`node_group`).
GROUPS = ("stem", "head", "se")
#: Module names of BlurBall's stem (top-level convolutions, their BatchNorms, and the stem's ReLU).
STEM_MODULES = ("conv1", "bn1", "conv2", "bn2", "relu")
#: Module name of BlurBall's head (the 1x1 convolution that writes the logits).
HEAD_MODULE = "final_layers"
#: How prose names each layer group.
GROUP_WORDS = {"stem": "stem", "head": "head", "se": "SE layers"}

#: Result kinds (``graphbook.record.results.KINDS``) this module's rows are written as.
KIND_MATRIX = "int8-matrix"
KIND_TENSOR_ERRORS = "int8-tensor-errors"

FP32_NAME = "fp32"
#: Quantized bins of ONNX Runtime's entropy calibrator (its default, kept here); see :class:`Int8Config`.
ENTROPY_QUANTIZED_BINS = 128
#: Histogram bins of the design's real entropy calibration: 4x the quantized bins gives the search
#: 193 candidate ranges; 2048 (TensorRT's choice) makes ONNX Runtime's Python search take minutes.
ENTROPY_BINS = 512
#: Column of the largest logit difference from the FP32 model (the book's one name for it).
MAX_ABS_DIFF = "max_abs_diff"
BASELINE_NAME = "baseline"


class Int8MatrixError(ValueError):
    """A configuration or an argument the INT8 matrix refuses, with the reason (Chapter 4)."""


# --------------------------------------------------------------------------------------------------
# The design
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Int8Config:
    """One static-quantization choice (Chapter 4).

    ``exclude`` names layer groups kept in FP32 (a subset of :data:`GROUPS`); ``reduce_range`` is
    the value used; ``role`` says where the configuration sits in the design ("baseline",
    "vary <factor>", "combination"). ``histogram_bins`` (Entropy and Percentile only) sets the
    calibrator's histogram size; None keeps what ``quantize_static`` uses, which cannot be changed
    through its arguments: 128 bins for Entropy -- as many as the 128 quantized bins the entropy
    search needs, which leaves it one candidate threshold, the full range, i.e. MinMax's -- and 2048
    for Percentile.
    """

    name: str
    per_channel: bool = True
    calibration: str = "MinMax"
    pre_process: bool = False
    exclude: tuple[str, ...] = ()
    reduce_range: bool = False
    role: str = "baseline"
    histogram_bins: int | None = None

    def __post_init__(self):
        if self.calibration not in CALIBRATIONS:
            raise Int8MatrixError(f"calibration must be one of {list(CALIBRATIONS)}, got {self.calibration!r}")
        unknown = [g for g in self.exclude if g not in GROUPS]
        if unknown:
            raise Int8MatrixError(f"unknown layer group(s) {unknown}; choose from {list(GROUPS)}")
        if len(set(self.exclude)) != len(self.exclude):
            raise Int8MatrixError(f"layer groups repeated in {self.exclude}")
        if self.histogram_bins is not None:
            if self.calibration == "MinMax":
                raise Int8MatrixError("histogram_bins applies to Entropy and Percentile calibration, not MinMax")
            if isinstance(self.histogram_bins, bool) or not isinstance(self.histogram_bins, int) \
                    or self.histogram_bins < 2 * ENTROPY_QUANTIZED_BINS:
                raise Int8MatrixError(f"histogram_bins must be an integer >= {2 * ENTROPY_QUANTIZED_BINS} "
                                      f"(the entropy search needs more bins than its {ENTROPY_QUANTIZED_BINS} "
                                      f"quantized ones), got {self.histogram_bins!r}")

    @property
    def excluded(self) -> str:
        """The excluded groups as one cell, e.g. ``"stem+head+se"`` ("" when everything is quantized)."""
        return "+".join(g for g in GROUPS if g in self.exclude)

    def describe(self) -> str:
        """A short phrase for prose, e.g. "per-channel weights, Entropy calibration, stem kept in FP32"."""
        parts = ["per-channel weights" if self.per_channel else "per-tensor weights",
                 f"{self.calibration} calibration"
                 + (f" ({self.histogram_bins} histogram bins)" if self.histogram_bins else "")]
        if self.pre_process:
            parts.append("quant_pre_process")
        parts.append(_excluded_phrase(self.excluded))
        parts.append(f"reduce_range={self.reduce_range}")
        return ", ".join(parts)


def design(reduce_range: bool, *, smoke: bool = False) -> list[Int8Config]:
    """The configurations of the matrix, baseline first (Chapter 4).

    One factor at a time from the baseline (per-channel, MinMax, no pre-processing, nothing
    excluded, ``reduce_range`` as given, i.e. as :func:`graphbook.onnx_utils.int8_settings_for`
    chose for this CPU): per-tensor weights; Entropy as ``quantize_static`` runs it, and Entropy with
    :data:`ENTROPY_BINS` histogram bins (see :class:`Int8Config`: the first is MinMax in disguise);
    Percentile; ``quant_pre_process``; the stem, the head, the SE layers, and all three kept in FP32;
    the opposite ``reduce_range`` (to show what the CPU-specific choice is worth). Then two
    combinations: ``careful`` (Percentile, pre-processed, all three groups excluded) and
    ``per-tensor-excluded`` (per-tensor weights with all three excluded). 13 configurations.
    ``smoke=True`` gives 2 that still touch every code path: the baseline and a per-tensor, Entropy
    (own histogram), pre-processed, everything-excluded combination.
    """
    if not isinstance(reduce_range, bool):
        raise Int8MatrixError(f"reduce_range must be True or False, got {reduce_range!r}")
    base = Int8Config(BASELINE_NAME, reduce_range=reduce_range, role="baseline")
    if smoke:
        return [base, replace(base, name="smoke-combination", per_channel=False, calibration="Entropy",
                              histogram_bins=2 * ENTROPY_QUANTIZED_BINS, pre_process=True, exclude=GROUPS,
                              role="combination")]
    return [
        base,
        replace(base, name="per-tensor", per_channel=False, role="vary per_channel"),
        replace(base, name="entropy", calibration="Entropy", role="vary calibration"),
        replace(base, name=f"entropy-{ENTROPY_BINS}-bins", calibration="Entropy", histogram_bins=ENTROPY_BINS,
                role="vary calibration"),
        replace(base, name="percentile", calibration="Percentile", role="vary calibration"),
        replace(base, name="pre-processed", pre_process=True, role="vary pre_process"),
        replace(base, name="no-stem", exclude=("stem",), role="vary exclude"),
        replace(base, name="no-head", exclude=("head",), role="vary exclude"),
        replace(base, name="no-se", exclude=("se",), role="vary exclude"),
        replace(base, name="no-stem-head-se", exclude=GROUPS, role="vary exclude"),
        replace(base, name=f"reduce-range-{str(not reduce_range).lower()}", reduce_range=not reduce_range,
                role="vary reduce_range"),
        replace(base, name="careful", calibration="Percentile", pre_process=True, exclude=GROUPS,
                role="combination"),
        replace(base, name="per-tensor-excluded", per_channel=False, exclude=GROUPS, role="combination"),
    ]


def int8_settings() -> dict:
    """``reduce_range`` for this CPU and why, as :func:`graphbook.onnx_utils.int8_settings_for` decides (Chapter 4).

    Returns ``{"reduce_range": bool, "reduce_range_reason": str, "cpu_isa": str, "vnni": bool | None}``.
    The choice lives in ``int8_settings_for`` (one place decides for the whole book); this records it
    with the instruction set it was decided from (:func:`graphbook.record.environment.cpu_features`).
    """
    from .record.environment import cpu_features
    from .quantization import int8_settings_for

    features = cpu_features()
    settings = int8_settings_for(features)
    return {"reduce_range": bool(settings.reduce_range), "reduce_range_reason": settings.reason,
            "cpu_isa": features.get("isa", "unknown"), "vnni": features.get("vnni")}


# --------------------------------------------------------------------------------------------------
# Which nodes belong to the stem, the head and the SE layers
# --------------------------------------------------------------------------------------------------

def _scopes(node) -> list[str]:
    """The module path the exporter recorded for ``node`` (``pkg.torch.onnx.name_scopes``), or []."""
    import ast

    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                value = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return []
            return [str(v) for v in value] if isinstance(value, (list, tuple)) else []
    return []


def node_group(scopes: Sequence[str]) -> str | None:
    """``"stem"``, ``"head"``, ``"se"`` or None for a node's module path (Chapter 4).

    ``scopes`` is the exporter's ``name_scopes`` list, e.g. ``['', 'stage2', ..., 'stage2.0.branches.0.0.se',
    'mean']``. Stem: the first module is one of :data:`STEM_MODULES` (BlurBall's only top-level ReLU is
    the stem's; a BatchNorm folded into its convolution keeps the BatchNorm's name); head:
    :data:`HEAD_MODULE`; SE: any module path with an ``se`` part (``...se`` or ``...se.fc.0``).
    """
    modules = [s for s in scopes if s]
    if not modules:
        return None
    if any("se" in m.split(".") for m in modules):
        return "se"
    top = modules[0].split(".")[0]
    if top == HEAD_MODULE:
        return "head"
    if top in STEM_MODULES:
        return "stem"
    return None


def module_of(scopes: Sequence[str]) -> str:
    """The innermost module path in a ``name_scopes`` list (its last entry names the operation; Chapter 4)."""
    modules = [s for s in scopes if s]
    return modules[-2] if len(modules) >= 2 else (modules[0] if modules else "")


def classify_nodes(model_or_path) -> dict[str, str | None]:
    """Node name -> :func:`node_group` for every node of an exported BlurBall (Chapter 4)."""
    import onnx

    model = onnx.load(str(model_or_path), load_external_data=False) if isinstance(model_or_path, (str, Path)) \
        else model_or_path
    return {node.name: node_group(_scopes(node)) for node in model.graph.node}


def nodes_in_groups(model_or_path, groups: Iterable[str]) -> list[str]:
    """Names of the nodes in the given layer groups, for ``quantize_static(nodes_to_exclude=...)`` (Chapter 4).

    Raises :class:`Int8MatrixError` when a requested group has no node: the model was not exported
    with module names (``pkg.torch.onnx.name_scopes``), and excluding nothing would be a silent lie.
    """
    groups = tuple(groups)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise Int8MatrixError(f"unknown layer group(s) {unknown}; choose from {list(GROUPS)}")
    classes = classify_nodes(model_or_path)
    chosen = [name for name, group in classes.items() if group in groups]
    empty = [g for g in groups if not any(group == g for group in classes.values())]
    if empty:
        raise Int8MatrixError(f"no node of the model belongs to {empty}: was it exported by torch.onnx with "
                              "module names (pkg.torch.onnx.name_scopes metadata)?")
    return chosen


# --------------------------------------------------------------------------------------------------
# Building a quantized model
# --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    """Silence the quantizer: calibration progress on stdout and the pre-processing hint on the root logger."""
    root = logging.getLogger()
    previous = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(previous)


def _calibrate_to_cache(model_path: Path, reader, config: Int8Config, cache: Path, *, workdir: Path) -> None:
    """Run ONNX Runtime's histogram calibrator with ``config.histogram_bins`` bins; save its ranges to ``cache``.

    ``quantize_static`` passes no bin count to its calibrator, but it accepts a calibration cache
    (``calibration_cache_path``) in the format of ``calibrate.save_tensors_data``: the same
    calibrator (``create_calibrator``, on the operator types ``quantize_static`` would calibrate)
    writes one with the bins asked for.
    """
    from onnxruntime import quantization as quant
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    if cache.exists():
        cache.unlink()  # a stale cache would be loaded instead of calibrating
    op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))  # quantize_static's default op types
    calibrator = create_calibrator(Path(model_path), op_types,
                                   augmented_model_path=str(workdir / f"{cache.stem}.augmented.onnx"),
                                   calibrate_method=getattr(quant.CalibrationMethod, config.calibration),
                                   extra_options={"num_bins": config.histogram_bins,
                                                  "num_quantized_bins": ENTROPY_QUANTIZED_BINS})
    calibrator.collect_data(reader)
    save_tensors_data(calibrator.compute_data(), cache)


def quantize_config(fp32_path: str | Path, out_path: str | Path, config: Int8Config, frames: Sequence) -> dict:
    """Build the Q/DQ model of one configuration, calibrated on ``frames`` (Chapter 4).

    With ``config.pre_process`` the FP32 model first goes through ``quant_pre_process`` (symbolic
    shape inference and ONNX Runtime's basic graph optimizations) into ``<out>.pre.onnx``. The
    nodes of the excluded groups are looked up in the model that is actually quantized. Activations
    are uint8, weights int8. Returns ``{"path", "quantize_s", "excluded_nodes", "quantize_nodes"}``.
    """
    import onnx
    from onnxruntime import quantization as quant
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from .onnx_utils import check_model_file
    from .quantization import calibration_reader, qdq_counts

    fp32_path = check_model_file(fp32_path)
    out_path = Path(out_path)
    if out_path.suffix != ".onnx":
        raise Int8MatrixError(f"the output path must end in .onnx, got {str(out_path)!r}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    source = fp32_path
    with _quiet():
        if config.pre_process:
            source = out_path.with_name(out_path.stem + ".pre.onnx")
            quant_pre_process(str(fp32_path), str(source))
        excluded = nodes_in_groups(source, config.exclude) if config.exclude else []
        input_name = onnx.load(str(source), load_external_data=False).graph.input[0].name
        reader, cache = calibration_reader(input_name, frames), None
        if config.histogram_bins is not None:  # calibrate here, hand the ranges over as a calibration cache
            cache = out_path.with_name(out_path.stem + ".calibration.json")
            _calibrate_to_cache(source, reader, config, cache, workdir=out_path.parent)
            reader = None
        quant.quantize_static(str(source), str(out_path), reader,
                              quant_format=quant.QuantFormat.QDQ, activation_type=quant.QuantType.QUInt8,
                              weight_type=quant.QuantType.QInt8, per_channel=config.per_channel,
                              reduce_range=config.reduce_range, nodes_to_exclude=excluded or None,
                              calibrate_method=getattr(quant.CalibrationMethod, config.calibration),
                              calibration_cache_path=str(cache) if cache else None)
    return {"path": out_path, "quantize_s": time.perf_counter() - start, "excluded_nodes": len(excluded),
            "quantize_nodes": qdq_counts(out_path)["QuantizeLinear"]}


# --------------------------------------------------------------------------------------------------
# Scoring and timing
# --------------------------------------------------------------------------------------------------

def clip_inputs(clips) -> list[np.ndarray]:
    """One normalised ``(1, 9, H, W)`` float32 input per clip (ImageNet normalisation, as in training;
    Chapter 4)."""
    from .blurball import imagenet_normalize
    from .synthetic_clips import frames_to_tensor

    return [imagenet_normalize(frames_to_tensor(clip)).numpy().astype(np.float32) for clip in clips]


def score_outputs(logits: Sequence[np.ndarray], clips, reference: Sequence[np.ndarray] | None = None) -> dict:
    """Score per-clip logits ``(1, 3, H, W)`` against the clips' labels, and against reference logits (Chapter 4).

    Returns :func:`graphbook.scoring.summarize_matches`'s dict plus ``max_abs_diff`` (the largest
    logit difference from ``reference`` over all clips; NaN without a reference).
    """
    from .decoding import decode_batch
    from .scoring import match_detections, summarize_matches

    if len(logits) != len(clips):
        raise Int8MatrixError(f"{len(logits)} outputs for {len(clips)} clips")
    decoded = [frames for out in logits for frames in decode_batch(out)]
    summary = summarize_matches(match_detections(decoded, list(clips)))
    diff = math.nan
    if reference is not None:
        diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                   for a, b in zip(logits, reference))
    return {**summary, MAX_ABS_DIFF: diff}


# --------------------------------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------------------------------

@dataclass
class MatrixRun:
    """What :func:`run_matrix` measured: one row per model (FP32 first), and the failures by name (Chapter 4)."""

    rows: list[dict] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)


def run_matrix(fp32_path: str | Path, configs: Sequence[Int8Config], calibration_frames: Sequence, eval_clips,
               *, workdir: str | Path, threads: int = 2, repeats: int = 5,
               log: Callable[[str], object] | None = None) -> MatrixRun:
    """Quantize, score and time every configuration, with the FP32 model as the reference row (Chapter 4).

    ``calibration_frames``: model inputs drawn from the *training* clips; ``eval_clips``: the
    held-out clips (:func:`graphbook.synthetic_clips.held_out_clips`) at the model's input size. Each
    row holds the configuration, ``status`` ("ok" or the error that stopped it: a configuration that
    fails is recorded, not dropped), the quantized model's node counts, the scores of
    :func:`score_outputs` and the latency (median, min, max over ``repeats`` round-robin calls of one
    clip, ``threads`` intra-op threads, ONNX Runtime's default ``all`` optimization level).
    """
    from .onnx_utils import make_session

    if not configs:
        raise Int8MatrixError("the matrix needs at least one configuration")
    names = [c.name for c in configs]
    if FP32_NAME in names or len(set(names)) != len(names):
        raise Int8MatrixError(f"configuration names must be unique and not {FP32_NAME!r}: {names}")
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
    fp32_row = {"config": FP32_NAME, "role": "reference", "precision": "fp32", "per_channel": "",
                "calibration": "", "histogram_bins": "", "pre_process": "", "excluded": "", "reduce_range": "", "status": "ok",
                "quantize_s": 0.0, "excluded_nodes": 0, "quantize_nodes": 0,
                **score_outputs(reference, eval_clips, reference)}
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
                    "quantize_nodes": built["quantize_nodes"], **score_outputs(logits, eval_clips, reference)})
        sessions[config.name] = session
        run.paths[config.name] = built["path"]
        run.rows.append(row)
        say(f"{config.name}: detection rate {row['detection_rate']:.3f}, max abs diff {row['max_abs_diff']:.3g}")

    feed_name = fp32_session.get_inputs()[0].name
    x0 = inputs[0]
    times = timing.interleaved({name: (lambda s=s: s.run(None, {feed_name: x0})) for name, s in sessions.items()},
                               warmup=1, repeats=repeats)
    fp32_ms = times[FP32_NAME].median_ms
    for row in run.rows:
        timed = times.get(row["config"])
        row.update({"height": int(height), "width": int(width), "threads": threads, "timing_runs": repeats,
                    "calibration_clips": len(calibration_frames), "eval_clips": len(eval_clips)})
        if timed:
            row.update({"latency_ms": timed.median_ms, "latency_min_ms": timed.min_ms,
                        "latency_max_ms": timed.max_ms, "speedup_vs_fp32": fp32_ms / timed.median_ms})
        else:
            row.update({"latency_ms": math.nan, "latency_min_ms": math.nan, "latency_max_ms": math.nan,
                        "speedup_vs_fp32": math.nan})
    return run


# --------------------------------------------------------------------------------------------------
# Which tensors quantize worst (onnxruntime.quantization.qdq_loss_debug)
# --------------------------------------------------------------------------------------------------

def _sqnr_db(reference, candidate) -> float:
    """Signal-to-quantization-noise ratio in dB (``qdq_loss_debug``'s), NaN when the reference is all zero.

    A tensor that is zero in the reference (a ReLU that is off for every input shown) carries no signal,
    so its ratio says nothing about quantization: ONNX Runtime's own function returns 0 dB for it,
    which would rank it first.
    """
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

    values = [reference] if isinstance(reference, np.ndarray) else list(reference)
    if not values or float(np.linalg.norm(np.concatenate([np.ravel(v) for v in values]))) <= 1e-12:
        return math.nan
    return float(compute_signal_to_quantization_noice_ratio(reference, candidate))


def _producers_and_consumers(model_path: Path) -> tuple[dict, dict]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    produced, consumed = {}, {}
    for node in model.graph.node:
        for name in node.output:
            produced[name] = node
        for name in node.input:
            consumed.setdefault(name, node)
    return produced, consumed


def tensor_errors(fp32_path: str | Path, qdq_path: str | Path, frames: Sequence, *, workdir: str | Path,
                  top: int = 10) -> list[dict]:
    """The ``top`` worst-quantized activations and weights of a Q/DQ model, ranked by SQNR (Chapter 4).

    Uses ONNX Runtime's ``qdq_loss_debug``: both models are augmented to output every intermediate
    tensor (``modify_model_output_intermediate_tensors``), run on ``frames`` (``collect_activations``),
    matched (``create_activation_matching``, ``create_weight_matching``) and compared
    (``compute_activation_error``, ``compute_weight_error``) as signal-to-quantization-noise ratios in
    dB: lower is worse. Activations are ranked by ``qdq_sqnr_db``, the error of quantizing that tensor
    alone; ``xmodel_sqnr_db`` is the FP32 model's tensor against the quantized model's (errors
    accumulated from the input up to there).

    Two corrections to the raw helpers: the Q/DQ format drops a ReLU and lets the quantizer's clamp
    at zero do its work, so the tensor "before Q" of a ReLU output is the pre-ReLU value; the ReLU is
    applied to it before comparing, so that ``qdq_sqnr_db`` measures rounding and clipping only. And
    a tensor that is all zero in the reference has no signal-to-noise ratio (NaN, not ranked) instead
    of the helpers' 0 dB.

    Rows: tensor_kind ("activation" or "weight"), rank, tensor, module (from the exporter's module
    names; for a weight, its parameter's module), group (:func:`node_group`, "other" outside the
    stem, head and SE layers), op (the producing or consuming node's type), sqnr_db (the ranking
    value), qdq_sqnr_db, xmodel_sqnr_db.
    """
    from onnxruntime.quantization import qdq_loss_debug as qld

    from .quantization import calibration_reader

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise Int8MatrixError(f"top must be a positive integer, got {top!r}")
    fp32_path, qdq_path, workdir = Path(fp32_path), Path(qdq_path), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    produced, consumed = _producers_and_consumers(fp32_path)
    import onnx

    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    with _quiet():
        activations = {}
        for label, path in (("float", fp32_path), ("qdq", qdq_path)):
            augmented = workdir / f"debug_{label}_{path.stem}.onnx"
            qld.modify_model_output_intermediate_tensors(str(path), str(augmented))
            activations[label] = qld.collect_activations(str(augmented), calibration_reader(input_name, frames))
        matched = qld.create_activation_matching(activations["qdq"], activations["float"])
        matched = {name: m for name, m in matched.items() if m.get("float")}
        for name, match in matched.items():
            node = produced.get(name)
            if node is not None and node.op_type == "Relu":  # the Q/DQ model dropped it: see the docstring
                match["pre_qdq"] = [np.maximum(a, 0) for a in match["pre_qdq"]]
        act_err = qld.compute_activation_error(matched, err_func=_sqnr_db)
        weight_err = qld.compute_weight_error(qld.create_weight_matching(str(fp32_path), str(qdq_path)))
    rows = []
    finite = [(name, err) for name, err in act_err.items() if not math.isnan(err["qdq_err"])]
    ranked = sorted(finite, key=lambda item: item[1]["qdq_err"])[:top]
    for rank, (name, err) in enumerate(ranked, 1):
        node = produced.get(name) or consumed.get(name)
        rows.append({"tensor_kind": "activation", "rank": rank, "tensor": name,
                     "module": module_of(_scopes(node)) if node is not None else "",
                     "group": (node_group(_scopes(node)) or "other") if node is not None else "other",
                     "op": node.op_type if node is not None else "", "sqnr_db": err["qdq_err"],
                     "qdq_sqnr_db": err["qdq_err"], "xmodel_sqnr_db": err.get("xmodel_err", math.nan)})
    for rank, (name, err) in enumerate(sorted(weight_err.items(), key=lambda item: item[1])[:top], 1):
        node = consumed.get(name)
        parameter = name.rsplit(".", 1)
        module = parameter[0] if len(parameter) == 2 and parameter[1] in ("weight", "bias") else \
            (module_of(_scopes(node)) if node is not None else "")
        rows.append({"tensor_kind": "weight", "rank": rank, "tensor": name, "module": module,
                     "group": (node_group(_scopes(node)) or "other") if node is not None else "other",
                     "op": node.op_type if node is not None else "", "sqnr_db": err,
                     "qdq_sqnr_db": math.nan, "xmodel_sqnr_db": math.nan})
    return rows


# --------------------------------------------------------------------------------------------------
# The recommendation
# --------------------------------------------------------------------------------------------------

def _excluded_phrase(excluded: str) -> str:
    """``"stem+head+se"`` -> "stem, head and SE layers kept in FP32"; "" -> "every layer quantized"."""
    words = [GROUP_WORDS.get(g, g) for g in str(excluded).split("+") if g]
    if not words:
        return "every layer quantized"
    joined = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return f"{joined} kept in FP32"


def _is_true(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) if value == value else False  # NaN -> False


def _config_phrase(row) -> str:
    excluded = str(row.get("excluded") or "")
    excluded = "" if excluded.lower() == "nan" else excluded
    bins = row.get("histogram_bins")
    bins = f" ({int(float(bins))} histogram bins)" if bins not in (None, "") and str(bins) != "nan" else ""
    parts = ["per-channel weights" if _is_true(row.get("per_channel")) else "per-tensor weights",
             f"{row.get('calibration')} calibration{bins}"]
    if _is_true(row.get("pre_process")):
        parts.append("quant_pre_process")
    parts.append(_excluded_phrase(excluded))
    parts.append(f"reduce_range={_is_true(row.get('reduce_range'))}")
    return ", ".join(parts)


def recommend_int8_config(frame, *, latency_budget_ms: float | None = None, max_rate_drop: float = 0.02,
                          max_error_increase_px: float = 0.25, rate_tolerance: float | None = None,
                          error_tolerance_px: float = 0.05):
    """Choose a configuration from one recorded run of the matrix, by data, and say why (Chapter 4).

    ``frame``: the rows of ONE run of kind :data:`KIND_MATRIX` (e.g. :func:`latest_matrix`), or several
    runs combined by :func:`combine_runs` (:func:`combined_matrix`: latency decided on the median across
    runs), including the FP32 reference row. Among the INT8 configurations that ran (``status == "ok"``) within the
    latency budget (default: the FP32 model's median latency, i.e. INT8 must be faster):

    1. keep those as accurate as the best: detection rate within ``rate_tolerance`` of the best
       (default: one visible frame) and median position error within ``error_tolerance_px`` of the
       best of those (default 0.05 px, a twentieth of a pixel: differences below it are noise of the
       decoder's sub-pixel centre, not quantization);
    2. take the fastest of them (median latency); the sentence says when its lead over the next one
       is within the spread of the timed calls.

    If that configuration loses more than ``max_rate_drop`` of detection rate or more than
    ``max_error_increase_px`` of median position error against FP32, or no INT8 configuration ran
    within the budget, the FP32 row is returned instead and the sentence gives the reason.

    Returns ``(row, sentence)``: the chosen row (a pandas Series) and one sentence with the numbers.
    Raises :class:`Int8MatrixError` for an empty frame, one without its FP32 row, or one that mixes runs.
    """
    import pandas as pd

    if frame is None or len(frame) == 0:
        raise Int8MatrixError("no recorded INT8 matrix run: run `python code/bench_int8.py` first")
    frame = pd.DataFrame(frame).reset_index(drop=True)
    if "run_id" in frame and frame["run_id"].nunique() > 1:
        raise Int8MatrixError(f"the frame holds {frame['run_id'].nunique()} runs; pass one "
                              "(latest_matrix or graphbook.record.results.latest_run) so the configurations share "
                              "one machine and load")
    missing = [c for c in ("config", "precision", "status", "detection_rate", "median_error_px", "latency_ms")
               if c not in frame]
    if missing:
        raise Int8MatrixError(f"not an INT8 matrix run: columns {missing} are missing")
    fp32 = frame[frame["precision"] == "fp32"]
    if fp32.empty:
        raise Int8MatrixError("the run has no FP32 reference row to compare with")
    fp32 = fp32.iloc[0]
    ok = frame[(frame["precision"] == "int8") & (frame["status"].astype(str) == "ok")]
    ok = ok[ok["latency_ms"].notna() & ok["detection_rate"].notna()]
    size = f"{int(fp32['height'])}x{int(fp32['width'])}" if "height" in fp32 else "the recorded size"
    threads = f"{int(fp32['threads'])} threads" if "threads" in fp32 else "the recorded threads"
    clips = f"{int(fp32['eval_clips'])} held-out clips" if "eval_clips" in fp32 else "the held-out clips"
    budget = float(fp32["latency_ms"]) if latency_budget_ms is None else float(latency_budget_ms)
    budget_phrase = f"FP32's {budget:.1f} ms" if latency_budget_ms is None else f"{budget:.1f} ms"
    total = int((frame["precision"] == "int8").sum())
    if ok.empty:
        return fp32, (f"Keep FP32: none of the {total} INT8 configurations ran here, so there is nothing to "
                      f"trade its detection rate of {fp32['detection_rate']:.1%} for.")
    within = ok[ok["latency_ms"] <= budget]
    if within.empty:
        fastest = ok.sort_values("latency_ms").iloc[0]
        return fp32, (f"Keep FP32: no INT8 configuration ran within the latency budget ({budget_phrase} at "
                      f"{size}, {threads}); the fastest, {fastest['config']}, took {fastest['latency_ms']:.1f} ms.")
    visible = float(fp32.get("visible_frames", float("nan")))
    if rate_tolerance is None:
        rate_tolerance = 1.0 / visible if visible == visible and visible > 0 else 0.0
    best_rate = float(within["detection_rate"].max())
    accurate = within[within["detection_rate"] >= best_rate - rate_tolerance - 1e-12]
    best_error = float(accurate["median_error_px"].min())
    if best_error == best_error:  # a NaN error (no hit at all) leaves the detection rate to decide
        accurate = accurate[accurate["median_error_px"] <= best_error + error_tolerance_px + 1e-12]
    ranked = accurate.sort_values(["latency_ms", "median_error_px"], na_position="last")
    chosen = ranked.iloc[0]
    rate_drop = float(fp32["detection_rate"]) - float(chosen["detection_rate"])
    error_increase = float(chosen["median_error_px"]) - float(fp32["median_error_px"])
    numbers = (f"{chosen['detection_rate']:.1%} of visible frames found (FP32 {fp32['detection_rate']:.1%}), "
               f"median position error {chosen['median_error_px']:.2f} px (FP32 {fp32['median_error_px']:.2f} px)")
    if "median_angle_error_deg" in chosen and chosen["median_angle_error_deg"] == chosen["median_angle_error_deg"]:
        numbers += (f", median blur-angle error {chosen['median_angle_error_deg']:.1f} deg "
                    f"(FP32 {fp32['median_angle_error_deg']:.1f} deg)")
    if rate_drop > max_rate_drop or error_increase > max_error_increase_px:
        limit = (f"{rate_drop:.1%} of detections, more than the {max_rate_drop:.0%}" if rate_drop > max_rate_drop
                 else f"{error_increase:.2f} px of position error, more than the {max_error_increase_px:.2f} px")
        return fp32, (f"Keep FP32: the best INT8 configuration within the latency budget, {chosen['config']} "
                      f"({_config_phrase(chosen)}), loses {limit} this recommendation accepts, on {clips} "
                      f"({numbers}).")
    speedup = float(fp32["latency_ms"]) / float(chosen["latency_ms"])
    run_count = int(chosen["runs"]) if "runs" in chosen and chosen["runs"] == chosen["runs"] else 1
    timing = f"median across {run_count} recorded runs" if run_count > 1 else "median of the timed calls"
    spread = "the spread across runs" if run_count > 1 else "the spread of the timed calls"
    sentence = (f"Use {chosen['config']} ({_config_phrase(chosen)}): on {clips} at {size} it keeps "
                f"{numbers}, and runs in {chosen['latency_ms']:.1f} ms against {fp32['latency_ms']:.1f} ms for FP32 "
                f"({speedup:.2f}x, {threads}, {timing}). Of the {len(within)} INT8 configurations "
                f"(of {total}) that ran within the latency budget ({budget_phrase}), {len(accurate)} "
                f"{'is' if len(accurate) == 1 else 'are'} as accurate as the best (detection rate within one frame, "
                f"median position error within {error_tolerance_px:.2f} px)")
    if len(accurate) == 1:
        return chosen, sentence + ", and this is it."
    runner = ranked.iloc[1]
    sentence += "; this is the fastest of them"
    if {"latency_min_ms", "latency_max_ms"} <= set(ranked.columns) and \
            float(runner["latency_min_ms"]) <= float(chosen["latency_max_ms"]):
        sentence += (f", but its lead over {runner['config']} ({chosen['latency_ms']:.1f} vs "
                     f"{runner['latency_ms']:.1f} ms) is within {spread}, so on this machine "
                     f"they are equally good choices")
    return chosen, sentence + "."


def describe_tensor_errors(frame) -> str:
    """One sentence on a recorded worst-tensor ranking (kind :data:`KIND_TENSOR_ERRORS`) (Chapter 4).

    Says how many of the worst activations fall in each layer group, names the worst one with its
    module and SQNR, and gives the range of the worst weights' SQNR. Raises :class:`Int8MatrixError`
    for a frame without activation rows.
    """
    import pandas as pd

    frame = pd.DataFrame(frame)
    if frame.empty or "tensor_kind" not in frame:
        raise Int8MatrixError("no worst-tensor ranking recorded: run `python code/bench_int8.py` first")
    acts = frame[frame["tensor_kind"] == "activation"].sort_values("rank")
    weights = frame[frame["tensor_kind"] == "weight"]
    if acts.empty:
        raise Int8MatrixError("the ranking has no activation rows")
    names = {"se": "squeeze-and-excitation layers", "stem": "stem", "head": "head", "other": "rest of the network"}
    recorded = acts["group"] if "group" in acts else pd.Series([None] * len(acts), index=acts.index)
    derived = acts["module"].fillna("").map(lambda m: node_group(["", str(m)]) or "other")  # runs before "group"
    groups = recorded.where(recorded.notna() & (recorded.astype(str) != ""), derived).value_counts()
    parts = [f"{n} in the {names.get(g, g)}" for g, n in groups.items()]
    parts[0] = f"{groups.iloc[0]} {'is' if groups.iloc[0] == 1 else 'are'}" + parts[0][len(str(groups.iloc[0])):]
    worst = acts.iloc[0]
    sentence = (f"Of the {len(acts)} activations that quantize worst in the baseline model, "
                f"{', '.join(parts[:-1]) + ' and ' + parts[-1] if len(parts) > 1 else parts[0]}; the worst, "
                f"{worst['tensor']} ({worst['op']} in {worst['module']}), keeps a signal-to-quantization-noise "
                f"ratio of {worst['sqnr_db']:.1f} dB")
    if not weights.empty:
        sentence += (f", while the worst weights keep {weights['sqnr_db'].min():.1f} to {weights['sqnr_db'].max():.1f} dB")
    return sentence + "."


def latest_matrix(results_dir: str | Path | None = None):
    """The rows of the newest recorded run of the matrix (kind :data:`KIND_MATRIX`), typed (Chapter 4).

    ``results_dir`` defaults to the book's ``data/results`` (or ``$GRAPHBOOK_RESULTS_DIR``). Smoke runs
    (``smoke`` column true) are never chosen. Raises :class:`Int8MatrixError` when no run is recorded.
    """
    return _latest(KIND_MATRIX, results_dir)


def latest_tensor_errors(results_dir: str | Path | None = None):
    """The rows of the newest recorded worst-tensor ranking (kind :data:`KIND_TENSOR_ERRORS`) (Chapter 4)."""
    return _latest(KIND_TENSOR_ERRORS, results_dir)


def _latest(kind_name: str, results_dir):
    from .record import results

    frame = results.load(kind_name, results_dir=results_dir)
    if "smoke" in frame:
        frame = frame[~frame["smoke"].map(_is_true)]
    if frame.empty:
        raise Int8MatrixError(f"no recorded {kind_name} run (smoke runs excluded): run `python code/bench_int8.py`")
    return results.latest_run(frame).reset_index(drop=True)


def combine_runs(frame):
    """One row per configuration from every recorded run of the newest run's machine and conditions (Chapter 4).

    The accuracy columns are deterministic (same clips, same seeds, same models) and come from the
    newest run; the latency is decided across runs, as :func:`graphbook.record.runs.summarize_runs` does for
    every benchmark of the book: ``latency_ms`` is the median of the runs' medians, ``latency_min_ms``
    and ``latency_max_ms`` the smallest and largest run median, ``runs`` how many runs timed the
    configuration, and ``speedup_vs_fp32`` is recomputed from the combined medians. Runs on another
    machine fingerprint (CPU model, instruction set, threads), at another input size or on another
    number of held-out clips are left out, as are configurations the newest run does not have.
    The result has one ``run_id`` (the combined runs' ids joined by "+"), so
    :func:`recommend_int8_config` accepts it.
    """
    import pandas as pd

    from .record import results
    from .record import runs as recorded_runs

    frame = pd.DataFrame(frame)
    if frame.empty:
        raise Int8MatrixError("no recorded INT8 matrix run: run `python code/bench_int8.py` first")
    if "run_id" not in frame:
        raise Int8MatrixError("the frame has no run_id column: pass rows from graphbook.record.results.load")
    framed = recorded_runs.add_machine(frame)
    latest = results.latest_run(framed)
    same = framed[framed[recorded_runs.MACHINE] == latest[recorded_runs.MACHINE].iloc[0]]
    for column in ("height", "width", "eval_clips"):
        if column in same:
            same = same[same[column] == latest[column].iloc[0]]
    timed = same[(same["status"].astype(str) == "ok") & same["latency_ms"].notna()]
    summary = recorded_runs.summarize_runs(timed, by="config", value="latency_ms").set_index("config")
    combined = latest.drop(columns=[recorded_runs.MACHINE]).copy()
    for column, source in (("latency_ms", "median"), ("latency_min_ms", "min"), ("latency_max_ms", "max"),
                           ("runs", "runs")):
        combined[column] = combined["config"].map(summary[source]) if not summary.empty else math.nan
    fp32 = combined.loc[combined["precision"] == "fp32", "latency_ms"]
    if not fp32.empty:
        combined["speedup_vs_fp32"] = float(fp32.iloc[0]) / combined["latency_ms"]
    combined["run_id"] = "+".join(dict.fromkeys(str(r) for r in same["run_id"]))
    return combined.reset_index(drop=True)


def combined_matrix(results_dir: str | Path | None = None):
    """:func:`combine_runs` over every recorded (non-smoke) run of the matrix (Chapter 4)."""
    from .record import results

    frame = results.load(KIND_MATRIX, results_dir=results_dir)
    if "smoke" in frame:
        frame = frame[~frame["smoke"].map(_is_true)]
    if frame.empty:
        raise Int8MatrixError("no recorded int8-matrix run (smoke runs excluded): run `python code/bench_int8.py`")
    return combine_runs(frame)


def matrix_table(frame):
    """The columns of a matrix run that a chapter shows, FP32 first (Chapter 4)."""
    columns = [c for c in ("config", "role", "per_channel", "calibration", "histogram_bins", "pre_process",
                           "excluded", "reduce_range", "status", "detection_rate", "median_error_px",
                           "median_angle_error_deg", "max_abs_diff", "latency_ms", "speedup_vs_fp32") if c in frame]
    return frame[columns].reset_index(drop=True)
