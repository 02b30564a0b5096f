"""Chapter set-up: the same threads, seeds and plot style under nbval, the book build or a reader's Jupyter."""
from __future__ import annotations

import json
import math
import os
import random
import re

import matplotlib
import numpy as np
import pandas as pd
import torch

from graphbook.config import THREADS
from graphbook.measure.environment import fingerprint, inductor_cache_dir_for_caps, set_threads
from graphbook.paths import DATA_DIR, REPO_ROOT
from graphbook.record import recording, results, runs

#: Words a reader reads per minute, for a chapter's reading time.
READING_WPM = 200


def setup_chapter(threads: int = THREADS, seed: int = 0) -> dict:
    """Fix threads (explicitly: defaults differ by machine), seeds and plot style; return the fingerprint."""
    set_threads(threads)
    capped_cache = inductor_cache_dir_for_caps()   # capped ISA: never reuse graphs compiled without the cap
    if capped_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = capped_cache
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 110, "figure.figsize": (7.0, 4.0),
                                "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                                "axes.spines.right": False})
    return fingerprint(threads)


def read_data_csv(relative: str):
    """Read a CSV from ``data/``, with a clear error if it is missing."""
    path = DATA_DIR / relative
    if not path.exists():
        raise FileNotFoundError(f"data file {relative!r} is missing under {DATA_DIR}; see data/README.md")
    return pd.read_csv(path)


def chapter_timing(notebook: str) -> dict:
    """A chapter's reading time (its Markdown at :data:`READING_WPM`, a glued value one word, rounded up to the
    minute), its last recorded execution (minutes, and the machine) from ``notebook_executions.csv``, and the
    reference recording its recorded figures come from (its id, machine and torch)."""
    cells = json.loads((REPO_ROOT / "chapters" / notebook).read_text())["cells"]
    words = sum(len(re.sub(r"\{[^}]*\}`[^`]*`", "X", "".join(c["source"])).split())
                for c in cells if c["cell_type"] == "markdown")
    executions = results.load("notebook-executions")
    reference = recording.reference()
    last = executions[executions["notebook"] == f"chapters/{notebook}"].sort_values("executed_at").iloc[-1]
    return {"reading_minutes": math.ceil(words / READING_WPM), "execution_minutes": float(last["seconds"]) / 60,
            "executed_on": runs.machine_label({**last.to_dict(), "threads": THREADS}),   # setup_chapter's threads
            "recording_id": reference.id, "recorded_on": reference.cpu, "recorded_torch": reference.torch}
