"""Write tlparse's HTML report of BlurBall's torch.compile where the book build publishes it (Chapter 3)."""
from __future__ import annotations

import sys
from pathlib import Path

from graphbook.paths import TLPARSE_REPORT_DIR
from graphbook.record.cli import add_input_size, add_threads, directory, make_parser
from graphbook.teach import diagnostics


def parse_args(argv=None):
    parser = make_parser("make_tlparse_report.py", __doc__.splitlines()[0], results_dir=False)
    parser.add_argument("--out", type=directory, default=TLPARSE_REPORT_DIR,
                        help="output folder, replaced (default images/extra/tlparse)")
    add_input_size(parser, (32, 64))
    add_threads(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    if not diagnostics.tlparse_available():
        print("make_tlparse_report: error: tlparse is not installed (pip install -r requirements.txt)",
              file=sys.stderr)
        return 3
    try:
        command = "python code/make_tlparse_report.py " + " ".join(argv if argv is not None else sys.argv[1:])
        index = diagnostics.tlparse_report(args.out, height=args.height, width=args.width, threads=args.threads,
                                           command=command.strip())
    except (RuntimeError, OSError) as error:
        print(f"make_tlparse_report: error: {str(error).splitlines()[0] if str(error) else error}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in Path(args.out).rglob("*") if p.is_file())
    print(f"wrote {index} ({size / 1e6:.1f} MB in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
