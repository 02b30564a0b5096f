"""Record which eager operators each Inductor kernel of BlurBall holds, from Inductor's own provenance (Chapter 3)."""
from __future__ import annotations

import sys

import pandas as pd

from graphbook.config import SMALL_SIZE
from graphbook.measure import environment
from graphbook.paths import DATA_DIR, PROVENANCE_VIEW_DIR
from graphbook.record import cli, results
from graphbook.teach import diagnostics
from graphbook.teach import kernel_provenance as kp

PROG = "trace_kernel_provenance.py"


def parse_args(argv=None):
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    cli.add_input_size(parser, SMALL_SIZE)
    cli.add_threads(parser)
    parser.add_argument("--view-dir", type=cli.directory, metavar="DIR",
                        help="folder of the provenance page, replaced (default: <results file stem>.view beside the "
                             "results file; scripts/publish_provenance_view.py publishes the reference recording's)")
    parser.add_argument("--model", choices=sorted(kp.TRACED_MODELS), default="blurball",
                        help="tiny: a three-layer stand-in that checks the pipeline in seconds (needs --results-dir "
                             "outside data/results, so it never mixes with the book's runs)")
    args = parser.parse_args(argv)
    book = {(DATA_DIR / "results").resolve(), PROVENANCE_VIEW_DIR.resolve()}
    chosen = {args.results_dir.resolve(), *([args.view_dir.resolve()] if args.view_dir else [])}
    if args.model == "tiny" and chosen & book:
        parser.error("--model tiny needs --results-dir outside data/results and a --view-dir other than the book's "
                     "(a stand-in must not replace the book's record)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    if not diagnostics.tlparse_available():
        print(f"{PROG}: error: tlparse is not installed (pip install -r requirements.txt)", file=sys.stderr)
        return cli.EXIT_RESOURCE_ABSENT
    try:
        traced = kp.trace_blurball(height=args.height, width=args.width, threads=args.threads, model=args.model)
    except (RuntimeError, OSError) as error:
        print(f"{PROG}: error: {str(error).splitlines()[0] if str(error) else error}", file=sys.stderr)
        return cli.EXIT_CHECK_FAILED
    rows = kp.provenance_rows(traced["mapping"], traced["nodes"])
    untraced = kp.untraced_launches(pd.DataFrame(rows), kp.page_output_code(traced["page"]))
    if untraced:
        print(f"{PROG}: error: launches not traced to an eager operator: {', '.join(untraced[:5])}", file=sys.stderr)
        return cli.EXIT_CHECK_FAILED
    env = {**environment.fingerprint(threads=args.threads), "model": args.model, "height": args.height,
           "width": args.width}
    path = results.write_run("kernel-provenance", rows, env, results_dir=args.results_dir)
    page = kp.publish_page(traced["page"], args.view_dir or path.with_suffix(kp.VIEW_SUFFIX), {
        "torch": env["torch"], "tlparse": diagnostics.tlparse_version(), "cpu": env["cpu_model"],
        "date_utc": env["date"], "input_shape": [1, 9, args.height, args.width], "threads": args.threads,
        "results_file": path.name, "command": "python code/trace_kernel_provenance.py " + " ".join(sys.argv[1:] if argv is None else argv)})
    launches = len({r["launch"] for r in rows})
    print(f"wrote {path} ({len(rows)} rows, {launches} launches traced) and {page}")
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
