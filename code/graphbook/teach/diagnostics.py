"""The compiler's own diagnostics: TORCH_LOGS, tlparse, and a graph break found and fixed (Chapter 3). Logs
are captured in a fresh process: logging is set up when torch is imported, and the chapter's graphs must not mix in."""
from __future__ import annotations

import datetime
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from torch._logging._internal import log_registry

from graphbook.compilers.inductor_tools import explain
from graphbook.config import THREADS
from graphbook.measure import environment
from graphbook.measure.timing import time_cpu
from graphbook.paths import TLPARSE_REPORT_DIR

#: The artifacts Chapter 3 shows, in order; on CPU ``schedule`` logs nothing for the C++ backend (GPU scheduling
#: code writes it), while ``fusion`` logs every round of the scheduler's attempts and ``output_code`` the wrapper.
CHAPTER_ARTIFACTS = ("graph_breaks", "recompiles", "fusion", "schedule", "output_code")

# One record starts with glog's prefix: level letter, MMDD, time, thread id, file:line]
_RECORD_START = re.compile(r"^(?:\[rank\d+\]:)?[VIWEDC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
_ARTIFACT_TAG = re.compile(r"\[__(\w+)\]\s?")


def available_log_artifacts() -> list[str]:
    """Names ``TORCH_LOGS`` accepts in this torch: artifacts and component aliases."""
    return sorted(set(log_registry.artifact_names) | set(log_registry.log_alias_to_log_qnames))


@dataclass
class LogCapture:
    """The log of one run of :func:`capture_torch_logs`."""

    records: dict[str, list[str]]     # artifact (or "other") -> records, each one message (may span lines)
    returncode: int
    seconds: float
    stdout: str = ""
    stderr: str = field(default="", repr=False)

    def counts(self) -> dict[str, int]:
        return {name: len(items) for name, items in self.records.items()}

    def excerpt(self, artifact: str, max_records: int = 3, max_lines: int = 12, grep: str | None = None) -> str:
        """The first ``max_records`` records of ``artifact`` (containing ``grep``), each cut to ``max_lines``."""
        items = [r for r in self.records.get(artifact, []) if grep is None or grep in r]
        parts = []
        for record in items[:max_records]:
            lines = record.splitlines()
            cut = lines[:max_lines] + ([f"    ... ({len(lines) - max_lines} more lines)"]
                                       if len(lines) > max_lines else [])
            parts.append("\n".join(cut))
        if len(items) > max_records:
            parts.append(f"... and {len(items) - max_records} more {artifact} records")
        return "\n".join(parts) if parts else f"(no {artifact} records)"


def _parse_torch_log(text: str) -> dict[str, list[str]]:
    """Split a ``TORCH_LOGS`` stderr into records by artifact tag; untagged component records are "other"."""
    records: dict[str, list[str]] = {}
    current: list[str] | None = None
    header = None
    for line in text.splitlines():
        start = _RECORD_START.match(line)
        if start:
            message = line[start.end():]
            compile_id = re.match(r"^\[[\d/_!-]+\] ", message)
            message = message[compile_id.end():] if compile_id else message
            tag = _ARTIFACT_TAG.match(message)
            name = tag.group(1) if tag else "other"
            message = message[tag.end():] if tag else message
            # torch prefixes every line of a multi-line message with the same header
            line_header = (line[:start.end()], compile_id.group(0) if compile_id else "", name)
            if current is not None and line_header == header:
                current.append(message)
                continue
            header = line_header
            current = [message]
            records.setdefault(name, []).append(current)  # type: ignore[arg-type]
        elif current is not None:
            current.append(line)
    return {name: ["\n".join(r) for r in items] for name, items in records.items()}


def capture_torch_logs(code: str, logs: Sequence[str] = CHAPTER_ARTIFACTS, *, timeout: float = 300,
                       threads: int = THREADS) -> LogCapture:
    """Run ``code`` in a fresh interpreter with ``TORCH_LOGS`` set to ``logs``. Unknown names are refused here with the
    valid ones (torch would fail the run); ``TimeoutError`` past ``timeout`` s."""
    logs = [str(name).lstrip("+") for name in logs]
    known = set(available_log_artifacts())
    unknown = [name for name in logs if name not in known]
    if unknown:
        raise ValueError(f"unknown TORCH_LOGS name(s) {unknown}; this torch offers {sorted(known)}")
    env = {**os.environ, "TORCH_LOGS": ",".join(logs), "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the logged run did not finish within {timeout} s") from None
    seconds = time.perf_counter() - start
    return LogCapture(_parse_torch_log(proc.stderr), proc.returncode, seconds, proc.stdout, proc.stderr)


#: Snippets for :func:`capture_torch_logs`: each compiles something small and typical.
SCENARIOS = {
    # Chapter 3's function with two breaks, then a second input shape, which recompiles
    "graph_breaks": (
        "import io, torch\n"
        "from graphbook.teach.diagnostics import _detect_with_breaks\n"
        "f = torch.compile(_detect_with_breaks)\n"
        "sink = io.StringIO()\n"
        "f(torch.ones(8), sink)\n"
        "f(torch.ones(16), sink)\n"
    ),
    # a conv -> BN -> ReLU -> add block and an SE tail: fusion decisions, schedule, generated code
    "conv_block": (
        "import torch\n"
        "from graphbook.teach.diagnostics import _small_conv_block\n"
        "model, x = _small_conv_block()\n"
        "with torch.no_grad():\n"
        "    torch.compile(model)(x)\n"
    ),
}


def run_scenario(name: str, logs: Sequence[str] = CHAPTER_ARTIFACTS, **kwargs) -> LogCapture:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; choose one of {sorted(SCENARIOS)}")
    return capture_torch_logs(SCENARIOS[name], logs, **kwargs)


def _small_conv_block(channels: int = 16, size: int = 32, seed: int = 0):
    """(model, input): conv3x3 -> BN -> SE gate -> + input -> ReLU, eval mode, seeded."""
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(channels)
            self.fc1 = nn.Linear(channels, channels // 4, bias=False)
            self.fc2 = nn.Linear(channels // 4, channels, bias=False)

        def forward(self, x):
            y = self.bn(self.conv(x))
            gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3))))))
            return torch.relu(y * gate[:, :, None, None] + x)

    model = Block().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(1, channels, size, size)


# ------------------------------------------------------------------------------------- graph breaks
def _detect_with_breaks(x: torch.Tensor, log=None) -> torch.Tensor:
    """Chapter 3's example with two breaks: a ``print`` of a tensor and a branch on its value."""
    y = torch.sigmoid(x * 2)
    print("peak", y.max(), file=log if log is not None else sys.stdout)   # a Python side effect
    if y.sum() > 4:                                                       # data-dependent branch
        return y - 0.5
    return y + 0.5


def _detect_fullgraph(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in one graph, ``(result, peak)``: the caller prints, and both cheap sides go through ``torch.where``."""
    y = torch.sigmoid(x * 2)
    return torch.where(y.sum() > 4, y - 0.5, y + 0.5), y.max()


def _detect_cond(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same with ``torch.cond``: only the branch taken runs, the tool for expensive sides."""
    y = torch.sigmoid(x * 2)
    result = torch.cond(y.sum() > 4, lambda t: t - 0.5, lambda t: t + 0.5, (y,))
    return result, y.max()


def graph_break_comparison(size: int = 4096, repeats: int = 50, warmup: int = 5) -> list[dict]:
    """Before and after the fix: graphs and breaks, whether ``fullgraph=True`` compiles, median time, same result."""
    x = torch.linspace(-1, 1, size)
    sink = io.StringIO()
    expected = _detect_with_breaks(x, sink)
    # every variant returns a tuple whose first item is the result
    variants = {"with breaks (print + if)": lambda t: (_detect_with_breaks(t, sink),),
                "fixed: torch.where": _detect_fullgraph,
                "fixed: torch.cond": _detect_cond}
    rows = []
    for name, fn in variants.items():
        report = explain(lambda t, fn=fn: fn(t)[0], x)
        try:
            torch._dynamo.reset()
            torch.compile(fn, fullgraph=True)(x)
            fullgraph = True
        except Exception:  # Dynamo refuses a graph break under fullgraph=True
            fullgraph = False
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        out = compiled(x)[0]
        timing = time_cpu(lambda: compiled(x), warmup=warmup, repeats=repeats)
        rows.append({"variant": name, "graphs": report.graph_count, "graph_breaks": report.graph_break_count,
                     "fullgraph_compiles": fullgraph, "median_us": timing.median_ms * 1000,
                     "same_result": bool(torch.allclose(out, expected))})
    torch._dynamo.reset()
    return rows


# ------------------------------------------------------------------------------------------ tlparse
def tlparse_available() -> bool:
    return tlparse_command() is not None


def tlparse_command() -> str | None:
    """The ``tlparse`` executable beside this Python, else on ``PATH``, else None."""
    local = Path(sys.executable).with_name("tlparse")
    return str(local) if local.exists() else shutil.which("tlparse")


_TRACE_SCRIPT = (
    "import torch\n"
    "from graphbook.model import blurball\n"
    "torch.set_num_threads({threads})\n"
    "model = blurball.build_blurball()\n"
    "x = blurball.example_input(height={height}, width={width})\n"
    "with torch.no_grad():\n"
    "    torch.compile(model)(x)\n"
)


def traced_compile_log(script: str, trace_dir: str | Path, *args: str, env: dict | None = None,
                       timeout: float) -> Path:
    """The last log of ``script`` run in a fresh interpreter with ``TORCH_TRACE`` at ``trace_dir`` and Inductor's caches
    off (a cache hit would leave the trace without code)."""
    env = {**os.environ, **(env or {}), "TORCH_TRACE": str(trace_dir), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the traced compile failed: {proc.stderr[-1500:]}")
    logs = sorted(Path(trace_dir).glob("*.log"))
    if not logs:
        raise RuntimeError(f"TORCH_TRACE wrote no log under {trace_dir}")
    return logs[-1]


def tlparse_report(out_dir: str | Path, *, height: int = 96, width: int = 160, threads: int = THREADS,
                   timeout: float = 900, keep_raw: bool = False, command: str = "") -> Path:
    """Compile BlurBall under ``TORCH_TRACE``; tlparse's report written to ``out_dir`` (replaced); its index."""
    tool = tlparse_command()
    if tool is None:
        raise RuntimeError("tlparse is not installed (pip install tlparse; see requirements.txt)")
    out_dir = Path(out_dir)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="graphbook-trace-") as trace_dir:
        log = traced_compile_log(_TRACE_SCRIPT.format(threads=threads, height=height, width=width), trace_dir,
                                 timeout=timeout)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        proc = subprocess.run([tool, str(log), "-o", str(out_dir), "--overwrite", "--no-browser"],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not (out_dir / "index.html").exists():
            raise RuntimeError(f"tlparse failed: {(proc.stdout + proc.stderr)[-1500:]}")
    if not keep_raw:
        for name in ("raw.log", "raw.jsonl"):
            (out_dir / name).unlink(missing_ok=True)
    _fix_tlparse_pages(out_dir)
    files = [p for p in out_dir.rglob("*") if p.is_file() and p.name != "provenance.json"]
    record = {"torch": torch.__version__, "tlparse": tlparse_version(tool), "python": platform.python_version(),
              "cpu": environment.cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "machine": platform.machine(), "threads": threads, "input_shape": [1, 9, height, width],
              "model": "BlurBall (graphbook.model.blurball.build_blurball, eval, float32)",
              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": command or f"tlparse_report(height={height}, width={width}, threads={threads})",
              "seconds": round(time.perf_counter() - start, 1), "files": len(files),
              "bytes": sum(p.stat().st_size for p in files)}
    (out_dir / "provenance.json").write_text(json.dumps(record, indent=1) + "\n")
    return out_dir / "index.html"


_COLLECTIVES_LINK = re.compile(r"<p>\s*<a href=\"collectives_parity\.json\">.*?</p>\s*", re.S)
# tlparse 0.4.3's pages end their link-rewriting script with ``return url;`` where no ``url`` exists: an
# uncaught ReferenceError on every page opened without a query string (the browser test would fail it).
_UNDEFINED_RETURN = "if (queryParams.size === 0) return url;"


def _fix_tlparse_pages(out_dir: str | Path) -> int:
    """Mend tlparse's dead collectives link and undefined ``url`` for the browser check; how many pages changed."""
    out_dir = Path(out_dir)
    changed = 0
    for page in out_dir.rglob("*.html"):
        text = page.read_text()
        fixed = text.replace(_UNDEFINED_RETURN, "if (queryParams.size === 0) return;")
        if not (out_dir / "collectives_parity.json").exists():
            fixed = _COLLECTIVES_LINK.sub("", fixed)
        if fixed != text:
            page.write_text(fixed)
            changed += 1
    return changed


#: The report's page relative to the site root (``_config.yml``'s ``html_extra_path`` serves ``images/extra``).
TLPARSE_SITE_PATH = "tlparse/index.html"


def tlparse_version(tool: str | None = None) -> str:
    """The installed tlparse's (or ``tool``'s) version as ``--version`` prints it (``"0.4.3"``), or ``""``."""
    tool = tool or tlparse_command()
    if tool is None:
        return ""
    try:
        proc = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    words = proc.stdout.split()
    return words[-1] if proc.returncode == 0 and words else ""


def tlparse_provenance(report_dir: str | Path | None = None) -> dict:
    """How the committed tlparse report was made (its ``provenance.json``), with ``url`` and ``same_torch``."""
    folder = Path(report_dir) if report_dir is not None else TLPARSE_REPORT_DIR
    record_file = folder / "provenance.json"
    if not (folder / "index.html").is_file() or not record_file.is_file():
        raise FileNotFoundError(f"no tlparse report with provenance.json in {folder}: "
                                "run python code/make_tlparse_report.py")
    record = json.loads(record_file.read_text())
    release = str(record.get("torch", "")).split("+")[0]
    return {**record, "url": TLPARSE_SITE_PATH, "same_torch": release == torch.__version__.split("+")[0]}
