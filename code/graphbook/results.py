"""Append-only measurement records in ``data/results/`` (Chapter 2).

A measurement is never overwritten: :func:`append_rows` only ever opens a file in append mode and
writes the header only when it creates the file; :func:`unique_path` hands out file names that do
not exist yet. Every row carries the environment columns of
:func:`graphbook.environment.fingerprint`, so a reader can tell which machine and which versions
produced it.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable


def _columns(rows: list[dict], env: dict | None) -> list[str]:
    """Row keys in first-seen order, then the environment keys not already present."""
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(str(key))
    for key in env or {}:
        if key not in columns:
            columns.append(str(key))
    return columns


def _read_header(path: Path) -> list[str] | None:
    """The header of an existing CSV, or None if the file is empty."""
    with path.open(newline="") as handle:
        for header in csv.reader(handle):
            return header
    return None


def append_rows(path: str | Path, rows: Iterable[dict], env: dict | None = None) -> Path:
    """Append ``rows`` (each merged with ``env``) to the CSV at ``path`` (Chapter 2).

    Columns are the rows' keys in first-seen order followed by the ``env`` keys; a key that a row
    lacks is written as an empty cell, and a row's own value wins over an ``env`` value of the same
    name. The header is written only when the file is created (or is empty). If the file exists with
    a different header, nothing is written and ValueError names the columns that differ: appending
    would silently misalign the columns of earlier runs. Returns the path.
    """
    path = Path(path)
    rows = [dict(row) for row in rows]
    if not rows:
        raise ValueError("append_rows needs at least one row")
    for index, row in enumerate(rows):
        if not row:
            raise ValueError(f"row {index} is empty")
    columns = _columns(rows, env)
    existing = _read_header(path) if path.exists() else None
    if existing is not None and existing != columns:
        missing = [c for c in existing if c not in columns]
        extra = [c for c in columns if c not in existing]
        detail = []
        if missing:
            detail.append(f"file has columns the new rows lack: {missing}")
        if extra:
            detail.append(f"new rows have columns the file lacks: {extra}")
        if not detail:
            detail.append(f"same columns in a different order: file {existing}, rows {columns}")
        raise ValueError(f"header mismatch in {path}; nothing written ({'; '.join(detail)}). "
                         "Write to a new file (see unique_path) instead of changing an old one.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        if existing is None:
            writer.writeheader()
        for row in rows:
            writer.writerow({**(env or {}), **row})
    return path


def unique_path(directory: str | Path, stem: str, suffix: str = ".csv") -> Path:
    """A path ``directory/stem{suffix}`` that does not exist yet, else ``stem-2``, ``stem-3``... (Chapter 2).

    The directory is created if needed. The name is only reserved by convention (no file is
    created), which is enough for one writer at a time.
    """
    if not stem or "/" in stem or "\\" in stem:
        raise ValueError(f"stem must be a plain file name without slashes, got {stem!r}")
    if suffix and not suffix.startswith("."):
        suffix = "." + suffix
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    candidate = directory / f"{stem}{suffix}"
    counter = 2
    while candidate.exists():
        candidate = directory / f"{stem}-{counter}{suffix}"
        counter += 1
    return candidate


def read_results(glob_pattern: str, base: str | Path | None = None):
    """All CSVs matching ``glob_pattern`` as one DataFrame with a ``source_file`` column (Chapter 2).

    A relative pattern is resolved against ``base`` (default: the book's ``data/results/``). Files
    are read in sorted name order; columns a file lacks are left empty (NaN). With no match the
    result is an empty DataFrame that still has the ``source_file`` column.
    """
    import pandas as pd

    if base is None:
        from .book import RESULTS_DIR

        base = RESULTS_DIR
    pattern_path = Path(glob_pattern)
    if pattern_path.is_absolute():
        root, pattern = Path(pattern_path.anchor), str(pattern_path.relative_to(pattern_path.anchor))
    else:
        root, pattern = Path(base), glob_pattern
    frames = []
    for file in sorted(root.glob(pattern)):
        if file.is_file():
            frame = pd.read_csv(file)
            frame["source_file"] = file.name
            frames.append(frame)
    if not frames:
        return pd.DataFrame({"source_file": pd.Series(dtype=str)})
    return pd.concat(frames, ignore_index=True, sort=False)


def latest_source(frame):
    """The rows of the most recently recorded file in a :func:`read_results` frame (Chapter 4).

    "Most recent" is decided by each file's newest ``date`` value, not by its name: ``unique_path``
    names a second run of the day ``...-2.csv``, which sorts *before* the day's first file.
    """
    if frame.empty or "date" not in frame:
        return frame
    newest = frame.groupby("source_file")["date"].max().idxmax()
    return frame[frame["source_file"] == newest].reset_index(drop=True)
