#!/usr/bin/env python
"""Record everything the pages quote as recorded, in one sitting on this machine, as one recording.

Runs each command of a plan one after the other, every results file going to a new folder
``data/recordings/<id>/`` and every row stamped with the id, and appends to the folder's manifest a line as the
invocation starts (commit, boot, CPU flags, versions) and a line as each command ends (its times, exit, load, host
steal, and each file it wrote with its sha256). Refused on a tree with uncommitted changes. Run it on a quiet
machine: nothing else, no tests, no notebooks. ``scripts/verify_recording.py`` then checks the recording.

Exit status: 0 when every command completed (one whose variant failed its check completes: that is data) and the
recording is one sitting; 1 when a command did not, or the recording is not one sitting or disagrees with its
manifest; 2 bad arguments, a changed tree, or a resume at another commit or boot.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from graphbook.config import FULL_SIZE
from graphbook.measure import environment
from graphbook.measure.environment import fingerprint
from graphbook.model import ball, library
from graphbook.record import cli, recording
from graphbook.record.recording import Step
from graphbook.runtimes import browser_runtime

PROG = "record_sitting.py"
PLANS = ("book", "mini")
#: The residual add folded into the convolution, and not (Chapter 5's ablation): frozen, no fusion, in both precisions.
RESIDUAL_ADD_ABLATION = ("eager_fp32", "compile_freezing_no_fusion", "compile_freezing_out_of_place_conv_add_no_fusion",
                         "compile_freezing_no_fusion_bf16", "compile_freezing_out_of_place_conv_add_no_fusion_bf16")


def _blurball_inputs(scratch: Path) -> None:
    ball.save_command_inputs(scratch / "blurball_inputs.pt", calibration=4, check=4, height=FULL_SIZE[0],
                             width=FULL_SIZE[1])


def _library_images(scratch: Path) -> None:
    library.save_images(scratch / "images.pt", n=16, size=224)


def steps(scratch: Path, plan: str = "book") -> list[Step]:
    """A plan's commands, in order: ``book``, everything the pages quote (which command records what is in
    ``results.KINDS``); ``mini``, a few small commands that exercise the recording itself in the tests."""
    if plan not in PLANS:
        raise ValueError(f"unknown plan {plan!r}: choose from {', '.join(PLANS)}")
    if plan == "mini":
        return [
            Step(("code/03_fusion.py", "--size", "4096", "--repeats", "3", "--feature-map", "4", "16", "16",
                  "--no-compile", "--no-allocator")),
            Step(("code/bench_blurball_cpu.py", "--variants", "eager_fp32,eager_fp32_channels_last", "--height", "32",
                  "--width", "64", "--no-profile", "--ball-clips", "0", "--repeats", "3", "--warmup", "1",
                  "--peak-n", "64", "--probe-mib", "1")),
            Step(("code/trace_kernel_provenance.py", "--model", "tiny", "--height", "32", "--width", "48")),
        ]
    return [
        Step(("code/03_fusion.py",)),
        Step(("code/bench_blurball_cpu.py",)),
        Step(("code/bench_blurball_cpu.py", "--variants", ",".join(RESIDUAL_ADD_ABLATION), "--no-profile")),
        Step(("code/bench_onnxruntime.py",)),
        *[Step(("code/bench_int8.py",)) for _ in range(3)],   # one timed run per call; the book decides on three
        Step(("code/bench_ablation.py",)),
        Step(("code/bench_attribution.py",)),
        Step(("code/bench_restart_paths.py",)),
        Step(("code/bench_serving_load.py",)),
        Step(("code/bench_browser_ort.py",)),
        Step(("code/bench_litserve.py",)),
        Step(("code/bench_litserve.py", "--faults", "--max-queue", "16")),
        Step(("code/bench_tvm.py", "--height", "96", "--width", "160")),   # the size Chapter 3 quotes
        Step(("code/trace_kernel_provenance.py",)),
        Step(("scripts/torch_version_history.py",)),
        Step(("code/your_model.py", "--model", "graphbook.model.blurball:load_trained_blurball",
              "--inputs", str(scratch / "blurball_inputs.pt"), "--check", "graphbook.model.ball:same_ball",
              "--quick"), prepare=_blurball_inputs),
        Step(("code/your_model.py", "--model", "graphbook.model.library:resnet50",
              "--inputs", str(scratch / "images.pt"), "--check", "top1"), prepare=_library_images),
    ]


def versions() -> dict:
    """The versions a page quotes beyond the Python distributions a manifest names itself."""
    try:
        web = browser_runtime.onnxruntime_web_version()
    except (OSError, KeyError, ValueError):
        web = recording.UNKNOWN
    return {"onnxruntime-web": web, **environment.tool_versions()}


def main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(PROG, __doc__.splitlines()[1], results_dir=False)
    parser.add_argument("--recordings-dir", type=cli.directory, default=recording.RECORDINGS_DIR, metavar="DIR",
                        help="where the recording's folder is made (default data/recordings)")
    parser.add_argument("--resume", metavar="ID", help="continue the sitting ID: run only the commands its manifest lacks")
    parser.add_argument("--plan", choices=PLANS, default="book", help="which commands (default book: every kind a "
                                                                      "page quotes; mini: a few small ones)")
    args = parser.parse_args(argv)
    if args.resume and not (Path(args.recordings_dir) / args.resume / recording.LOG).is_file():
        parser.error(f"--resume {args.resume}: no append-only recording of that id under {args.recordings_dir}")
    with tempfile.TemporaryDirectory(prefix="sitting-") as scratch:   # the commands' input files, not kept
        try:
            done = recording.sit(steps(Path(scratch), args.plan), args.recordings_dir, fingerprint=fingerprint(),
                                 versions=versions(), scratch=Path(scratch), plan=args.plan,
                                 recording_id=args.resume, resume=bool(args.resume))
        except recording.RecordingError as refused:
            print(f"{PROG}: {refused}", file=sys.stderr)
            return cli.EXIT_USAGE
    problems = [f"exit status {c['exit']}: {c['command']}" for c in done.manifest["commands"]
                if not recording.completed(c)] + recording.sitting_problems(done) + recording.disagreements(
        done, needed=recording.PAGE_KINDS if args.plan == "book" else ())
    print(f"recording {done.id}: {len(done.manifest['files'])} files in {done.folder}")
    for command in done.manifest["commands"]:
        if command["exit"] == cli.EXIT_CHECK_FAILED and recording.completed(command):
            print(f"a variant failed its check (recorded as data): {command['command']}")
    print(f"to name it the reference, {recording.REFERENCE_FILE} holds the line: "
          f"{done.id} {recording.sha256(done.manifest_path)}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return cli.EXIT_CHECK_FAILED if problems else cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
