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

from graphbook import page_export
from graphbook.paths import REPO_ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs from its page")
    args = parser.parse_args(argv)
    try:
        texts = page_export.exported_modules(page_export.pages())
    except ValueError as err:
        print(f"export_taught_code.py: {err}", file=sys.stderr)
        return 2
    stale = sorted(path for path, text in texts.items() if path.read_text() != text)
    for path in stale:
        if args.check:
            print(f"{path.relative_to(REPO_ROOT)} differs from the page it was taught on", file=sys.stderr)
        else:
            path.write_text(texts[path])
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
