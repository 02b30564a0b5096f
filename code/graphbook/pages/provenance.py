"""Where and when each page last executed, from the record ``scripts/execute_notebooks.py`` stores in each notebook."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from myst_nb import glue

from graphbook.paths import REPO_ROOT

GLUE_MIME_PREFIX = "application/papermill.record/"


def _load(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable notebook ({err})") from err


def _machine(record: dict) -> str:
    """The CPU an execution ran on, by its fingerprint where recorded (one vendor string names CPUs of any speed)."""
    name = record.get("cpu_model", "")
    if record.get("cpu_family") in (None, ""):
        return name
    arch = record.get("cpu_microarch")
    return (f"{name} ({arch + ', ' if arch and arch != 'unknown' else ''}family {record['cpu_family']} model "
            f"{record.get('cpu_model_id')}, {record.get('cpu_isa')}, {record.get('cpu_ghz')} GHz measured)")


def chapter_table(root: Path = REPO_ROOT):
    """One row per chapter: title, when and where it last ran, how long, cells, what else ran, GPU part."""
    rows = []
    for path in sorted((root / "chapters").glob("*.ipynb")):  # reading order; appendix pages excluded
        notebook = _load(path)
        rec = notebook.get("metadata", {}).get("graphbook", {}).get("execution") or {}
        glued = {}  # every value the notebook glued, as stored in plain text
        for out in (out for cell in notebook.get("cells", []) for out in cell.get("outputs", [])):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            text = out.get("data", {}).get(GLUE_MIME_PREFIX + "text/plain")
            if name and text is not None:
                glued[name] = "".join(text)
        title = next((line[2:].strip() for cell in notebook.get("cells", []) if cell.get("cell_type") == "markdown"
                      for line in "".join(cell.get("source", [])).splitlines() if line.startswith("# ")), path.stem)
        rows.append({"chapter": title, "notebook": path.relative_to(root).as_posix(),
                     "executed_at": rec.get("executed_at", "never (no execution record)"),
                     "seconds": rec.get("seconds"), "code_cells": rec.get("code_cells"),
                     "others_cores_mean": rec.get("others_cores_mean"), "machine": _machine(rec),
                     "torch": rec.get("torch", ""), "git_commit": rec.get("git_commit", ""),
                     "gpu_part": glued.get("gpu_status", "no GPU part").strip("'\""),
                     "results_shown": glued.get("results_shown", "").strip("'\"")})
    columns = ["chapter", "notebook", "executed_at", "seconds", "code_cells", "others_cores_mean", "machine", "torch",
               "git_commit", "gpu_part", "results_shown"]
    return pd.DataFrame(rows, columns=columns)


def record_chapter_status(*, gpu_status: str | None = None, results_shown: list[str] | None = None) -> None:
    """Glue the chapter's GPU-part sentence and the result files it shows, for the provenance page."""
    if gpu_status is not None:
        glue("gpu_status", str(gpu_status), display=False)
    if results_shown is not None:
        glue("results_shown", ", ".join(sorted(str(r) for r in results_shown)) or "none", display=False)
