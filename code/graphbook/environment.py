"""Threads and the environment fingerprint that every measurement carries.

Introduced in Chapter 1: a number without the machine, the thread count and the library versions
that produced it cannot be compared with anything, so every record in ``data/results/`` and every
chapter's provenance line is built from :func:`fingerprint`.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def set_threads(threads: int) -> int:
    """Pin torch's intra-op thread count (Chapter 1). Returns the count actually in force.

    Raises ValueError for a count below 1: a silent fallback to "all cores" would make two
    runs of the same chapter incomparable.
    """
    import torch

    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux) or platform (elsewhere). Chapter 1."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit(root: Path = REPO_ROOT) -> str:
    """Short commit hash of the book's repository, with ``+dirty`` if files changed. Chapter 1."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "unknown"))
    except Exception:  # an optional package that is absent or broken is recorded, not fatal
        return "absent"


def gpu_info() -> dict:
    """Name, driver and CUDA version of GPU 0, or empty strings without CUDA. Chapter 1."""
    info = {"gpu_name": "", "gpu_driver": "", "cuda_version": ""}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu_name"] = torch.cuda.get_device_name(0)
            info["cuda_version"] = str(torch.version.cuda or "")
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            info["gpu_driver"] = out.splitlines()[0] if out else ""
    except (OSError, subprocess.SubprocessError, RuntimeError):
        pass
    return info


def fingerprint(threads: int | None = None) -> dict:
    """Everything a measurement needs to be compared later (Chapter 1).

    Keys: date (UTC, ISO 8601), git_commit, cpu_model, cpu_cores (logical), threads (torch's intra-op
    count, or the given one), gpu_name, gpu_driver, cuda_version, python, torch, onnxruntime, platform.
    """
    import torch

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count() or 0,
        "threads": int(threads if threads is not None else torch.get_num_threads()),
        **gpu_info(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": _version("onnxruntime"),
        "platform": platform.platform(terse=True),
    }
