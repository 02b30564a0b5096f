"""What a reader hands the your-model command (Chapter 8): a model factory, its inputs split into calibration and
check samples, and the check every variant must pass. Anything unusable raises :class:`YourModelError`, one line."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from graphbook.checks import compare_to_reference, leaves
from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.method.variants import arguments

#: Samples made when only a shape is given: half calibrate, half check.
RANDOM_SAMPLES = 8


class YourModelError(ValueError):
    """A bad argument, or a model that cannot be built or called: the command prints it and exits 2."""


def _load_callable(spec: str) -> Callable:
    """The callable named ``MODULE:NAME`` (``NAME`` may be dotted)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise YourModelError(f"expected MODULE:CALLABLE, got {spec!r}")
    try:
        target = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or the module's own error while importing
        raise YourModelError(f"cannot import {module_name!r}: {type(error).__name__}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise YourModelError(f"{module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise YourModelError(f"{spec} is a {type(target).__name__}, not a callable")
    return target


def build_model(spec: str) -> nn.Module:
    """Call the factory ``MODULE:CALLABLE``; its result in eval mode."""
    try:
        model = _load_callable(spec)()
    except YourModelError:
        raise
    except Exception as error:
        raise YourModelError(f"{spec}() raised {type(error).__name__}: {str(error).splitlines()[0][:200]}") from None
    if not isinstance(model, nn.Module):
        raise YourModelError(f"{spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def load_inputs(path: str | Path) -> tuple[torch.Tensor, ...]:
    """The samples in a ``torch.save`` file: one tensor, or a tuple of tensors (one per model argument), all with
    the samples along dimension 0."""
    path = Path(path)
    if not path.is_file():
        raise YourModelError(f"no inputs file {str(path)!r}")
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as error:
        raise YourModelError(f"cannot read {str(path)!r} as a torch.save file: {str(error).splitlines()[0]}") from None
    tensors = (saved,) if isinstance(saved, torch.Tensor) else tuple(saved) if isinstance(saved, (tuple, list)) else ()
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
        raise YourModelError(f"{str(path)!r} must hold one tensor or a tuple of tensors, got {type(saved).__name__}")
    if len({t.shape[0] for t in tensors}) != 1:
        raise YourModelError(f"the tensors in {str(path)!r} disagree on the number of samples (dimension 0): "
                             f"{[t.shape[0] for t in tensors]}")
    return tuple(t.float() if t.is_floating_point() else t for t in tensors)


def random_inputs(shape: Sequence[int], samples: int = RANDOM_SAMPLES, seed: int = 0) -> tuple[torch.Tensor]:
    """``samples`` normal random inputs of ``shape`` (one sample, without the sample dimension)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(samples, *shape, generator=generator),)


@dataclass
class Samples:
    """The inputs, batched: ``example`` (the first check batch) is timed, ``calibration`` calibrates INT8,
    ``check`` is where every variant is judged. ``random``: made from a shape, so no lower-precision verdict."""

    example: torch.Tensor | tuple
    calibration: list
    check: list
    random: bool

    @property
    def check_samples(self) -> int:
        return sum(arguments(batch)[0].shape[0] for batch in self.check)


def split(inputs: tuple[torch.Tensor, ...], *, batch: int, calibration: int | None, random: bool) -> Samples:
    """The first ``calibration`` samples (default: half) calibrate, the rest check; both in batches of ``batch``."""
    total = inputs[0].shape[0]
    calibration = total // 2 if calibration is None else calibration
    if calibration % batch or (total - calibration) < batch:
        raise YourModelError(f"{total} samples cannot give {calibration} calibration samples in batches of {batch} "
                             f"and at least one check batch of {batch}")

    def batches(start: int, stop: int) -> list:
        out = [tuple(t[i:i + batch] for t in inputs) for i in range(start, stop - batch + 1, batch)]
        return [b[0] if len(b) == 1 else b for b in out]
    check = batches(calibration, total)
    return Samples(example=check[0], calibration=batches(0, calibration), check=check, random=random)


def call(model: nn.Module, example) -> object:
    """One eager call, refusing inputs the model cannot take (one line, not its traceback)."""
    try:
        with torch.inference_mode():
            return model(*arguments(example))
    except Exception as error:
        shapes = [tuple(a.shape) for a in arguments(example)]
        raise YourModelError(f"the model refuses inputs of shape {shapes}: {type(error).__name__}: "
                             f"{str(error).splitlines()[0][:200]}") from None


# ------------------------------------------------------------------------------------------------ checks
@dataclass(frozen=True)
class Check:
    """A check of a variant's outputs against eager FP32's on every check batch: ``passed``, ``failures`` (samples
    that failed), ``samples``, and the ``statistic`` that decided it beside its ``limit``. ``task``: it judges what
    the output is for (a class, a box), so it can judge a lower precision; element-wise can only judge FP32."""

    name: str
    task: bool
    judge: Callable[[list, list], dict]


def elementwise(outputs: list, references: list) -> dict:
    """Every tensor within the book's tolerance of eager FP32's, relative to its magnitude."""
    compared = [compare_to_reference(o, r) for o, r in zip(outputs, references, strict=True)]
    return {"passed": all(c["same_output"] for c in compared), "failures": sum(not c["same_output"] for c in compared),
            "samples": len(compared), "statistic": max(c["relative_diff"] for c in compared),
            "limit": SAME_OUTPUT_ATOL, "max_abs_diff": max(c["max_abs_diff"] for c in compared)}


def _top_k(k: int) -> Callable[[list, list], dict]:
    """Eager FP32's top-1 class among the variant's ``k`` best, for every sample (classes: the last dimension of the
    output's first tensor)."""
    def judge(outputs: list, references: list) -> dict:
        missed = samples = 0
        for output, reference in zip(outputs, references, strict=True):
            scores, truth = (torch.as_tensor(leaves(x)[0]) for x in (output, reference))
            best = truth.reshape(-1, truth.shape[-1]).argmax(-1)
            kept = scores.reshape(-1, scores.shape[-1]).topk(k, dim=-1).indices
            missed += int((kept != best[:, None]).all(-1).sum())
            samples += len(best)
        return {"passed": missed == 0, "failures": missed, "samples": samples, "statistic": float(missed),
                "limit": 0.0}
    return judge


def _custom(judge: Callable, name: str) -> Callable[[list, list], dict]:
    """A reader's ``judge(outputs, references) -> bool | dict`` (a dict with ``passed``, and optionally
    ``failures``, ``samples``, ``statistic``, ``limit``) in the command's form."""
    def normalized(outputs: list, references: list) -> dict:
        verdict = judge(outputs, references)
        verdict = {"passed": verdict} if isinstance(verdict, bool) else verdict
        if not isinstance(verdict, dict) or not isinstance(verdict.get("passed"), bool):
            raise YourModelError(f"{name} must return a bool or a dict with a bool 'passed', got {verdict!r:.120}")
        return {"failures": int(not verdict["passed"]), "samples": len(outputs), "statistic": float("nan"),
                "limit": float("nan"), **verdict}
    return normalized


def parse_check(text: str) -> Check:
    """``elementwise`` (the default), ``top1``, ``topk:K`` or ``MODULE:FN``."""
    if text == "elementwise":
        return Check(text, False, elementwise)
    if text == "top1":
        return Check(text, True, _top_k(1))
    if text.startswith("topk:"):
        k = text.removeprefix("topk:")
        if not k.isdigit() or int(k) < 1:
            raise YourModelError(f"topk needs a positive K, as in topk:5; got {text!r}")
        return Check(text, True, _top_k(int(k)))
    return Check(text, True, _custom(_load_callable(text), text))
