"""ONNX Runtime sessions: levels, providers, options, running one; no torch, so a server on an ONNX file needs none."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from graphbook.config import THREADS

# Book names of ONNX Runtime's levels, in increasing order, with the enum member each stands for.
LEVEL_ENUM_NAMES = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                    "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}
LEVEL_NAMES = tuple(LEVEL_ENUM_NAMES)
#: ONNX Runtime's name for the rewrite of convolutions to its blocked NCHWc layout (part of the layout level).
NCHWC_TRANSFORMER = "NchwcTransformer"
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"


class OnnxModelError(ValueError):
    """A file that ONNX Runtime (or the onnx package) cannot load as a model (Chapter 4)."""


def optimization_level(name):
    """ONNX Runtime's ``GraphOptimizationLevel`` for a book level name (Chapter 4)."""
    member_name = LEVEL_ENUM_NAMES.get(name) if isinstance(name, str) else None
    if member_name is None:
        raise ValueError(f"unknown optimization level {name!r}; choose one of {list(LEVEL_NAMES)}")
    member = getattr(ort.GraphOptimizationLevel, member_name, None)
    if member is None:
        raise ValueError(f"this ONNX Runtime ({ort.__version__}) has no {member_name} level")
    return member


def check_model_file(path: str | Path) -> Path:
    """Return ``path`` if it exists and parses as an ONNX model, else raise a clear error (Chapter 4)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model {str(path)!r} does not exist (export it first with export_onnx)")
    try:
        onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises DecodeError, and others for other damage
        raise OnnxModelError(f"{str(path)!r} is not a readable ONNX model ({type(error).__name__}: {error}); "
                             "re-export it") from error
    return path


def ort_version() -> str:
    """The installed ONNX Runtime version (Chapter 4)."""
    return str(ort.__version__)


def available_providers() -> list[str]:
    """The execution providers this ONNX Runtime install offers, in its priority order (Chapter 4)."""
    return list(ort.get_available_providers())


@dataclass(frozen=True)
class ProviderChoice:
    """The providers a session will use and those that were asked for but are absent (Chapter 4)."""

    providers: tuple[str, ...]
    missing: tuple[str, ...] = ()

    def note(self) -> str:
        """One sentence saying what runs where, for printing in a chapter."""
        runs = ", ".join(self.providers)
        if not self.missing:
            return f"running on {runs}"
        return (f"{', '.join(self.missing)} not available in this ONNX Runtime install; "
                f"running on {runs} instead")


def resolve_providers(requested: Sequence[str] | str | None = None,
                      available: Sequence[str] | None = None) -> ProviderChoice:
    """Keep the requested providers this install has, in order, and always end with the CPU (Chapter 4)."""
    if requested is None:
        requested = [CPU_PROVIDER]
    elif isinstance(requested, str):
        requested = [requested]
    requested = list(requested)
    if not requested or not all(isinstance(p, str) and p for p in requested):
        raise ValueError(f"providers must be a non-empty list of provider names, got {requested!r}")
    have = list(available) if available is not None else available_providers()
    chosen = [p for p in dict.fromkeys(requested) if p in have]
    missing = [p for p in dict.fromkeys(requested) if p not in have]
    if CPU_PROVIDER not in chosen:
        chosen.append(CPU_PROVIDER)
    return ProviderChoice(tuple(chosen), tuple(missing))


def session_options(*, level="all", threads: int = THREADS, optimized_model_path: str | Path | None = None,
                    profile_prefix: str | Path | None = None):
    """``SessionOptions`` with the level, an explicit intra-op thread count and quiet logging (Chapter 4)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization_level(level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: the NCHWc "hardware specific" notice is expected
    if optimized_model_path is not None:
        Path(optimized_model_path).parent.mkdir(parents=True, exist_ok=True)
        options.optimized_model_filepath = str(optimized_model_path)
    if profile_prefix is not None:
        Path(profile_prefix).parent.mkdir(parents=True, exist_ok=True)
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    return options


def make_session(path: str | Path, *, level="all", threads: int = THREADS,
                 providers: Sequence[str] | str | None = None,
                 optimized_model_path: str | Path | None = None,
                 profile_prefix: str | Path | None = None,
                 provider_options: Sequence[Mapping] | None = None,
                 disabled_optimizers: Sequence[str] = ()):
    """An ``InferenceSession`` for the model at ``path`` (Chapter 4)."""
    path = check_model_file(path)
    requested = [CPU_PROVIDER] if providers is None else ([providers] if isinstance(providers, str)
                                                         else list(providers))
    choice = resolve_providers(requested)
    options_by_name = {}
    if provider_options is not None:
        if len(provider_options) != len(requested):
            raise ValueError("provider_options needs one mapping per requested provider "
                             f"({len(requested)}), got {len(provider_options)}")
        options_by_name = dict(zip(requested, provider_options))
    chosen_options = [dict(options_by_name.get(p, {})) for p in choice.providers]
    options = session_options(level=level, threads=threads, optimized_model_path=optimized_model_path,
                              profile_prefix=profile_prefix)
    try:
        return ort.InferenceSession(str(path), options, providers=list(choice.providers),
                                    provider_options=chosen_options,
                                    **({"disabled_optimizers": list(disabled_optimizers)} if disabled_optimizers else {}))
    except Exception as error:  # ORT raises its own pybind exception types (InvalidProtobuf, Fail...)
        raise OnnxModelError(f"ONNX Runtime could not load {str(path)!r}: {error}") from error


def run_session(session, inputs) -> np.ndarray:
    """Run a one-input, one-output session and return the output (Chapter 4)."""
    if not isinstance(inputs, Mapping):
        names = [i.name for i in session.get_inputs()]
        if len(names) != 1:
            raise ValueError(f"the model has inputs {names}; pass a dict name -> array")
        inputs = {names[0]: inputs}
    feed = {name: (value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value))
            for name, value in inputs.items()}
    return session.run(None, feed)[0]
