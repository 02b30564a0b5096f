#!/usr/bin/env python
"""Copy the code the chapters teach (their ``#@save MODULE`` cells) into the package's marked blocks.

Usage:
    .venv/bin/python scripts/export_taught_code.py           # write every block from its page
    .venv/bin/python scripts/export_taught_code.py --check   # exit 1 naming the modules that differ from their pages

Edit a taught function on its page, run this, then re-execute the page: the package runs what the reader reads.
"""
from __future__ import annotations

import argparse
import sys

from graphbook.paths import REPO_ROOT
from graphbook.pages import page_export


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs from its page")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = page_export.stale_modules(page_export.pages())
            for path in stale:
                print(f"{path.relative_to(REPO_ROOT)} differs from the page it was taught on", file=sys.stderr)
            return 1 if stale else 0
        for path, text in page_export.exported_modules(page_export.pages()).items():
            if path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path.relative_to(REPO_ROOT)}")
    except ValueError as err:
        print(f"export_taught_code.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
