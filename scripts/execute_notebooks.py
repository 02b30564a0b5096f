#!/usr/bin/env python
"""Re-execute book notebooks in place, so that every stored output comes from a real run.

Usage:
    .venv/bin/python scripts/execute_notebooks.py --all
    .venv/bin/python scripts/execute_notebooks.py chapters/02_fusion_on_a_laptop_cpu.ipynb [...]

Each notebook runs in a fresh kernel with its own folder as working directory. Only a notebook that
executed without error is written back; a failing one is left as it was (a re-run never destroys
earlier results) and the script exits 1 after trying the rest. Each written notebook records where
and when it ran in ``metadata.graphbook.execution`` (read by the provenance page and the policy
tests), and every run is appended to ``data/results/notebook_executions.csv``. The pages of one run share an
Inductor cache that is empty at its start, as on a reader's first run, so a page's compile times and execution time
do not depend on what this machine compiled before.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from graphbook import paths

ROOT = paths.REPO_ROOT  # graphbook itself is installed (scripts/setup_env.sh)

# Chapters first, the provenance page last: it reports on the chapters' fresh metadata.
ORDER = ["chapters", "appendix"]


def all_notebooks() -> list[Path]:
    found = []
    for folder in ORDER:
        found += sorted(p for p in (ROOT / folder).glob("*.ipynb"))
    return found


def execute(path: Path, timeout: int) -> dict:
    import nbclient
    import nbformat

    from graphbook.measure.environment import fingerprint, others_load

    nb = nbformat.read(path, as_version=4)
    started = time.time()
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    with others_load() as others:  # the page's live figures are only its own where nothing else ran beside it
        client.execute()
    seconds = time.time() - started
    env = fingerprint()
    record = {
        "notebook": path.relative_to(ROOT).as_posix(),
        "executed_at": env["date"],
        "seconds": round(seconds, 1),
        "code_cells": sum(1 for c in nb.cells if c.cell_type == "code"),
        **{k: env[k] for k in ("git_commit", "cpu_model", "cpu_cores", "gpu_name", "python", "torch",
                               "onnxruntime", "platform")},
        # the machine by its fingerprint, not its vendor string, which names CPUs of very different speed
        **{k: env.get(k, "") for k in ("cpu_vendor", "cpu_family", "cpu_model_id", "cpu_microarch", "cpu_ghz", "cpu_isa")},
        **others,
    }
    nb.metadata.setdefault("graphbook", {})["execution"] = record
    nbformat.write(nb, path)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to execute")
    parser.add_argument("--all", action="store_true", help="every chapter, then the appendix")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    paths = all_notebooks() if args.all else [p.resolve() for p in args.notebooks]
    if not paths:
        parser.error("name notebooks to execute, or pass --all")
    missing = [str(p) for p in paths if not p.is_file() or p.suffix != ".ipynb"]
    if missing:
        parser.error("not a notebook file: " + ", ".join(missing))
    if args.timeout < 1:
        parser.error("--timeout must be at least 1 second")

    from graphbook.measure.environment import EXECUTION_COMMIT_VARIABLE, git_commit
    from graphbook.record.results import append_rows

    # every page records the commit this run started from: the pages it writes do not make the next "dirty"
    os.environ[EXECUTION_COMMIT_VARIABLE] = git_commit()
    failed = []
    # a machine's own cache served this machine's pages compiles in seconds that a first run spends half a minute on
    with tempfile.TemporaryDirectory(prefix="graphbook-pages-inductor-") as cache, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):
        for path in paths:
            rel = path.relative_to(ROOT)
            print(f"executing {rel} ...", flush=True)
            try:
                record = execute(path, args.timeout)
            except Exception as err:  # report and go on: one broken chapter should not hide the others
                # nbclient's message carries the cell's traceback with terminal colours: keep its end, the failing line
                lines = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()
                print(f"FAILED {rel}: {type(err).__name__}:\n" + "\n".join(lines[-12:]), file=sys.stderr)
                failed.append(str(rel))
                continue
            try:
                append_rows(ROOT / "data" / "results" / "notebook_executions.csv", [record])
            except ValueError as err:  # the log's header differs: every later page would fail the same way
                print(f"execute_notebooks.py: error: {rel} ran and was written, but its run is not logged: {err}",
                      file=sys.stderr)
                return 1
            print(f"  ok in {record['seconds']:.0f} s", flush=True)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
