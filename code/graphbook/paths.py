"""Where the book's files live, found from this file's place in the editable checkout (nothing edits ``sys.path``)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CODE_DIR = REPO_ROOT / "code"
DATA_DIR = REPO_ROOT / "data"
SEED_DIR = DATA_DIR / "seed"
CHECKPOINT_DIR = DATA_DIR / "checkpoints"
#: BlurBall trained on the synthetic clips by ``code/train_blurball.py`` (committed with the book).
TRAINED_CHECKPOINT = CHECKPOINT_DIR / "blurball_synthetic.pt"
#: tlparse's report of one compile, kept as an extra page of the book (Chapter 3).
TLPARSE_REPORT_DIR = REPO_ROOT / "images" / "extra" / "tlparse"
#: tlparse's provenance page (eager operator -> post-grad node -> kernel) of one compile, beside it (Chapter 3).
PROVENANCE_VIEW_DIR = REPO_ROOT / "images" / "extra" / "tlparse_provenance"
#: Where measurements are written and read back. A test (or a lab engineer trying a scratch run) points the
#: whole book at another folder with the environment variable ``GRAPHBOOK_RESULTS_DIR``.
RESULTS_DIR = Path(os.environ["GRAPHBOOK_RESULTS_DIR"]).resolve() if os.environ.get("GRAPHBOOK_RESULTS_DIR") \
    else DATA_DIR / "results"


def script(name: str) -> Path:
    """The path of one of the book's scripts under ``code/``."""
    path = CODE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"no script {name!r} under {CODE_DIR}")
    return path
