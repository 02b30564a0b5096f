#!/usr/bin/env python
"""Verify a recording: prove from its own files what its manifest says, or name what cannot be proved.

Checks that its commands are the plan of scripts/record_sitting.py at its commit, read from git; that every row was
made at that commit, an ancestor of HEAD; that every file matches its sha256, every file in the folder is hashed and
the manifest's own sha256 is the one REFERENCE.txt names; that every timed row's statistics recompute from its
readings; that the controls hold (quiet commands, the planted fault rejected, the A/A pair not called faster); and
that it is one sitting (one commit, one boot, nothing between its invocations, no command run twice).

Prints one line per finding, ``FILE: CHECK: what``. Exit status: 0 verified; 1 findings; 2 bad arguments.
"""
from __future__ import annotations

import sys
from pathlib import Path

from graphbook import paths
from graphbook.record import cli, recording, verify

PROG = "verify_recording.py"


def main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(PROG, __doc__.splitlines()[1], results_dir=False)
    parser.add_argument("recording", type=cli.directory, help="the recording's folder, e.g. "
                                                               "data/recordings/rec-2026-12-06T0419Z")
    parser.add_argument("--reference-file", type=Path, metavar="FILE",
                        help="the REFERENCE.txt that names it (default: the one beside its folder)")
    parser.add_argument("--repo", type=cli.directory, default=paths.REPO_ROOT, metavar="DIR",
                        help="the repository whose history holds its commit (default this one)")
    args = parser.parse_args(argv)
    try:
        found = recording.read(args.recording)
    except recording.RecordingError as error:
        parser.error(str(error))
    findings = verify.verify(found, repo=args.repo, reference_file=args.reference_file)
    for finding in findings:
        print(f"{finding.file}: {finding.check}: {finding.detail}")
    if findings:
        print(f"recording {found.id}: {len(findings)} findings", file=sys.stderr)
        return cli.EXIT_CHECK_FAILED
    print(f"recording {found.id} verified: {len(found.manifest['commands'])} commands, "
          f"{len(found.manifest['files'])} files")
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
