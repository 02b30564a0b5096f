"""Runners: a model behind one call, NumPy in, NumPy logits out (Chapter 7)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from graphbook.config import THREADS
from graphbook.runtimes.ort_sessions import session_options

# torch is imported by the runners that need it: a server on an ONNX file runs without it (Chapter 6 times that).

ARTIFACT_SUFFIXES = (".pt2", ".onnx", ".ort")


class TorchRunner:
    """A PyTorch module (eager or ``torch.compile``) as a NumPy-in, NumPy-out callable (Chapter 7)."""

    runtime = "torch"

    def __init__(self, model, *, compile: bool = False):
        import torch

        self.model = model.eval()
        self.compiled = bool(compile)
        self.fn = torch.compile(model) if compile else self.model
        self.description = "torch.compile" if compile else "eager PyTorch"

    def arm(self) -> None:
        """From now on run only the code compiled so far (per thread; see the class docstring)."""
        if self.compiled:
            import torch

            self.fn = torch._dynamo.run(self.model)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        import torch

        from graphbook.measure.warmup import logits_of

        with torch.no_grad():
            out = self.fn(torch.from_numpy(batch))
        return logits_of(out).numpy()


class AotiRunner(TorchRunner):
    """An AOTInductor ``.pt2`` package loaded with ``torch._inductor.aoti_load_package`` (Chapter 7)."""

    runtime = "aoti"

    def __init__(self, path):
        self.path = str(path)
        import torch

        self.model = None
        self.fn = torch._inductor.aoti_load_package(self.path)
        self.compiled = False
        self.description = f"AOTInductor package {Path(path).name}"


class OrtRunner:
    """An ONNX Runtime session on a ``.onnx`` or ``.ort`` model, CPU provider (Chapter 7; no torch)."""

    runtime = "onnxruntime"
    compiled = False

    def __init__(self, path, *, threads: int = THREADS, level: str = "all"):
        self.path = str(path)
        options = session_options(level=level, threads=threads)
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = list(inp.shape)
        self.description = f"ONNX Runtime {Path(path).name} (level {level})"

    def arm(self) -> None:
        """Nothing to switch: a session never compiles on the request path."""

    def static_batch(self) -> int | None:
        """The model's fixed batch size, or None when dimension 0 is symbolic."""
        first = self.input_shape[0] if self.input_shape else None
        return first if isinstance(first, int) else None

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: batch})[0]


def load_artifact(path, *, threads: int = THREADS, level: str | None = None):
    """A runner for a deployment artifact, chosen by suffix (Chapter 7)."""
    path = Path(path)
    if path.suffix not in ARTIFACT_SUFFIXES:
        raise ValueError(f"artifact must end in {', '.join(ARTIFACT_SUFFIXES)}, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"artifact {str(path)!r} does not exist")
    try:
        if path.suffix == ".pt2":
            return AotiRunner(path)
        return OrtRunner(path, threads=threads, level=level or ("disabled" if path.suffix == ".ort" else "all"))
    except (ImportError, MemoryError):
        raise
    except Exception as exc:  # a corrupt or truncated file: the runtimes raise many kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"cannot load artifact {path.name!r}: {first[:300]}") from None
