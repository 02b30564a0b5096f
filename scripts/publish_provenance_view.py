#!/usr/bin/env python
"""Publish the reference recording's provenance view where the book serves it (images/extra/tlparse_provenance).

A sitting's trace_kernel_provenance.py writes its page into the recording, beside its results file, so no command
of a sitting writes into the tree; after naming a new reference, this copies its page to the folder Chapter 3 links.

Exit status: 0 published; 2 bad arguments; 3 the recording holds no provenance view.
"""
from __future__ import annotations

import shutil
import sys

from graphbook import paths
from graphbook.record import cli, recording
from graphbook.teach import kernel_provenance

PROG = "publish_provenance_view.py"


def main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(PROG, __doc__.splitlines()[1], results_dir=False)
    parser.add_argument("--recording", type=cli.directory, metavar="DIR", help="default: the reference recording")
    parser.add_argument("--to", type=cli.directory, default=paths.PROVENANCE_VIEW_DIR.parent, metavar="DIR",
                        help="the folder that receives tlparse_provenance/ (default images/extra)")
    args = parser.parse_args(argv)
    try:
        found = recording.reference() if args.recording is None else recording.read(args.recording)
    except recording.RecordingError as error:
        parser.error(str(error))
    view = kernel_provenance.recorded_view(found)
    if view is None:
        return cli.resource_absent(PROG, f"recording {found.id} holds no provenance view")
    target = args.to / paths.PROVENANCE_VIEW_DIR.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(view, target)
    print(f"published {view} as {target}")
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
