#!/usr/bin/env python
"""The freezing miscompile across torch versions, recorded in one sitting on one machine (appendix, Chapter 5).

Builds a throwaway environment with an older torch beside the book's pinned one (the book's own requirements with
only torch changed), then runs ``graphbook.freezing.torch_versions`` under each torch, one after the other: the two
reproducers, the scheduler change that fixed the bug switched both ways, and BlurBall's eager, default compile and
freezing, each checked against eager and timed in rotated runs. Writes one new ``cpu-torch-versions-<date>.csv``.

Exit status: 0 when every BlurBall variant passed its check under the pinned torch (the older torch's failures are
the history being recorded); 1 when one failed there; 2 bad arguments; 3 the older environment cannot be built.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from graphbook import paths
from graphbook.freezing import torch_versions
from graphbook.config import FULL_SIZE, THREADS
from graphbook.measure.environment import fingerprint
from graphbook.record import cli, results

PROG = "torch_version_history.py"
PINNED_PYTHON = sys.executable  # this environment: the book's pinned torch


def parse_args(argv):
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    parser.add_argument("--older-torch", default="2.13.0", help="the older torch to install (default 2.13.0)")
    parser.add_argument("--older-python", type=Path, metavar="PYTHON",
                        help="an existing interpreter with the older torch instead of building one")
    cli.add_input_size(parser, FULL_SIZE)
    cli.add_run_protocol_options(parser, repeats=8, warmup=2)
    parser.add_argument("--timeout", type=cli.positive_int, default=3600, help="seconds allowed per torch")
    args = parser.parse_args(argv)
    if args.older_python is not None and not args.older_python.is_file():
        parser.error(f"--older-python {args.older_python} is not a file")
    return args


def build_older_env(folder: Path, version: str) -> Path:
    """A venv in ``folder`` with requirements.txt's pins, torch ``version`` instead of the pinned one, and graphbook."""
    pins = [line for line in (paths.REPO_ROOT / "requirements.txt").read_text().splitlines()
            if not line.startswith(("-c ", "torch=="))]
    requirements = folder / "requirements-older-torch.txt"
    requirements.write_text("\n".join([f"torch=={version}"] + pins) + "\n")
    python = folder / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for command in ([sys.executable, "-m", "venv", str(folder / "venv")], pip + ["-r", str(requirements)],
                    pip + ["--no-deps", "--no-build-isolation", "-e", str(paths.REPO_ROOT)]):
        subprocess.run(command, check=True, capture_output=True, text=True)   # pip's output only on failure
    return python


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = {"height": args.height, "width": args.width, "runs": args.runs, "repeats": args.repeats,
            "warmup": args.warmup, "threads": args.threads, "timeout": args.timeout}
    with tempfile.TemporaryDirectory(prefix="graphbook-older-torch-") as scratch:
        older = args.older_python
        if older is None:
            print(f"building an environment with torch {args.older_torch} in {scratch} ...", flush=True)
            start = time.perf_counter()
            try:
                older = build_older_env(Path(scratch), args.older_torch)
            except subprocess.CalledProcessError as failed:
                last = (failed.stderr or "").strip().splitlines()[-1:] or ["no output"]
                return cli.resource_absent(PROG, f"could not build the torch {args.older_torch} environment "
                                                 f"(exit {failed.returncode}: {last[0]})")
            print(f"built in {time.perf_counter() - start:.0f} s", flush=True)
        answers = {}
        for label, python in (("older", str(older)), ("pinned", PINNED_PYTHON)):
            print(f"measuring under the {label} torch ({python}) ...", flush=True)
            answers[label] = torch_versions.run_in(python, spec, timeout=args.timeout)
    rows = [row for answer in answers.values() for row in answer["rows"]]
    path = results.write_run("torch-versions", rows, fingerprint(THREADS), results_dir=args.results_dir,
                             per_run="torch")
    frame = results.load("torch-versions", path.parent).query("source_file == @path.name")
    print(frame.groupby(["record", "case", "torch"], sort=False)["max_abs_diff"].max().unstack()
          .to_string(float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {path} (pinned torch {torch.__version__})")
    return cli.exit_status_for(PROG, answers["pinned"]["failed"])


if __name__ == "__main__":
    sys.exit(main())
