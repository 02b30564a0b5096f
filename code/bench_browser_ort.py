"""WebAssembly against native: the book's BlurBall file in headless Chromium and in ONNX Runtime (Chapter 4)."""
from __future__ import annotations

import sys
import tempfile

from graphbook.measure import environment, probes
from graphbook.record import cli, results
from graphbook.runtimes import browser_measure, browser_runtime

PROG = "bench_browser_ort"
SIZES = ("96x160", "288x512")  # graphbook.runtimes.browser_runtime.SIZES, spelled here so --help needs no torch
LEVELS = ("all", "disabled")


def parse_args(argv=None):
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    parser.add_argument("--sizes", type=cli.comma_choices(SIZES, "size"), default=SIZES,
                        help="comma-separated input sizes (default %(default)s)")
    parser.add_argument("--levels", type=cli.comma_choices(LEVELS, "level"), default=LEVELS,
                        help="comma-separated graph optimization levels (default %(default)s)")
    parser.add_argument("--threads", type=cli.positive_int, default=1,
                        help="threads on both sides (default 1; above 1 the page is served cross-origin isolated)")
    parser.add_argument("--runs", type=cli.int_at_least(3), default=3, help="independent runs (default and minimum 3)")
    parser.add_argument("--warmup", type=cli.int_at_least(1), default=2, help="untimed calls first (default 2)")
    parser.add_argument("--repeats", type=cli.int_at_least(3), default=10, help="timed calls at 96x160 (default 10)")
    parser.add_argument("--large-repeats", type=cli.int_at_least(3), default=3,
                        help="timed calls at 288x512 (default 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    try:
        browser_runtime.check_assets()
        browser_runtime.runtime_dir()
    except browser_runtime.BrowserAssetsError as error:
        return cli.resource_absent(PROG, f"error: {error}")
    env = environment.fingerprint(args.threads)  # taken first: a run of minutes must not fail at the end
    env["onnxruntime_web"] = browser_runtime.onnxruntime_web_version()
    repeats = {"96x160": args.repeats, "288x512": args.large_repeats}

    def copy_probe() -> dict:  # each run measures its own bandwidth (graphbook.record.runs.flag_under_load)
        return {results.COPY_GBPS: probes.copy_bandwidth(64 * 2**20, repeats=3)["gb_per_s"]}

    with tempfile.TemporaryDirectory(prefix="graphbook-ortweb-") as workdir:
        try:
            rows = browser_measure.measure_in_chromium(
                sizes=args.sizes, levels=args.levels, threads=args.threads, runs=args.runs, warmup=args.warmup,
                repeats=repeats, workdir=workdir, probes=copy_probe,
                progress=lambda line: print(line, flush=True))
        except browser_runtime.BrowserAssetsError as error:
            return cli.resource_absent(PROG, f"error: {error}")
    for row in rows:
        row[results.SAME_OUTPUT] = bool(row[results.SAME_OUTPUT])
    path = results.write_run("browser-ort", rows, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {path} ({len(rows)} rows)")
    failed = [f"{r['variant']}@{r['size']}" for r in rows if not r["passed"]]
    return cli.exit_status_for(PROG, failed)


if __name__ == "__main__":
    sys.exit(main())
