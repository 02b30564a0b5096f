"""Check each switch that may make Inductor freezing correct on BlurBall under torch 2.13 (Chapter 5)."""
from __future__ import annotations

import sys

import pandas as pd
import torch

from graphbook.compilers import miscompile
from graphbook.config import THREADS
from graphbook.measure import environment
from graphbook.model import blurball
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import cli, results
from graphbook.runtimes.variants import FREEZING_FIXES

PROG = "check_freezing_fixes.py"


def main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    parser.add_argument("--fixes", type=cli.comma_choices(FREEZING_FIXES, "fix"), default=tuple(FREEZING_FIXES),
                        help=f"comma-separated, from {', '.join(FREEZING_FIXES)} (default: all)")
    args = parser.parse_args(argv)
    if not TRAINED_CHECKPOINT.is_file():
        print(f"{PROG}: error: checkpoint {TRAINED_CHECKPOINT} is missing; recreate it with "
              "code/train_blurball.py", file=sys.stderr)
        return cli.EXIT_RESOURCE_ABSENT
    torch.set_num_threads(THREADS)
    model = blurball.load_trained_blurball()
    rows = []
    for fix in args.fixes:
        checked = miscompile.check_fix(fix, model)
        print(f"{fix}: {'matches eager everywhere' if all(r['same_output'] for r in checked) else 'DIFFERS'} "
              f"(largest max abs diff {max(r['max_abs_diff'] for r in checked):.3g})", flush=True)
        rows += checked
    path = results.write_run("freezing-fixes", rows, environment.fingerprint(threads=THREADS),
                             results_dir=args.results_dir)
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"wrote {path}")
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
