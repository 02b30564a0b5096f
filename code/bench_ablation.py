"""An Inductor ablation on this CPU, in the spirit of the PyTorch 2 paper's Table 4 (Chapter 3).

    .venv/bin/python code/bench_ablation.py                          # 96x160 input, 2 threads
    .venv/bin/python code/bench_ablation.py --height 288 --width 512 --repeats 5

BlurBall (batch 1) is compiled four times: all optimizations (freezing on), without fusion
(``max_fusion_size=1``), without freezing, and without both (see ``graphbook.inductor_tools.
ABLATION_CONFIGS`` for why these switches). For each variant, in this order:

1. compile and first call (seconds; a cold or warm Inductor cache, as found);
2. correctness against eager FP32: max abs diff and the per-frame heatmap peak positions;
3. kernels generated (definitions in the code), their launches per call, and library calls;
4. timing: eager and compiled calls alternate, one each per repeat, so every speedup is a ratio of
   medians taken under the same background load (summarised with the book's harness).

Rows are appended to ``data/results/ablation_cpu.csv`` (never rewritten) with the environment columns.
A cold run costs several minutes on 2 cores (four BlurBall compiles); a warm cache, about one.
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphbook.cli import OneLineParser, positive_int, multiple_of_8

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "results" / "ablation_cpu.csv"
FP32_TOLERANCE = 1e-3


def parse_args(argv=None):
    from graphbook.inductor_tools import ABLATION_CONFIGS

    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=multiple_of_8, default=96, help="input height (default 96)")
    parser.add_argument("--width", type=multiple_of_8, default=160, help="input width (default 160)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls per variant")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed calls per variant")
    parser.add_argument("--variants", default=",".join(ABLATION_CONFIGS),
                        help="comma-separated subset of: " + "; ".join(ABLATION_CONFIGS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="CSV to append to")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in ABLATION_CONFIGS]
    if unknown or not names:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(ABLATION_CONFIGS)}")
    args.variants = names
    return args


def run(args) -> list[dict]:
    import torch

    from graphbook import blurball, inductor_tools, results, timing
    from graphbook.environment import fingerprint, set_threads

    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    run_id = uuid.uuid4().hex[:8]
    rows = []
    with torch.no_grad():
        reference = model(x)
        reference_peaks = blurball.heatmap_peaks(reference)
        for name in args.variants:
            options = inductor_tools.ablation_options(name)
            start = time.perf_counter()
            generated = inductor_tools.compile_and_get_code(model, x, options=options)
            compile_s = time.perf_counter() - start
            compiled = generated.compiled
            max_diff = float((generated.output - reference).abs().max())
            same_peaks = bool(torch.equal(blurball.heatmap_peaks(generated.output), reference_peaks))
            if max_diff > FP32_TOLERANCE:
                print(f"warning: {name} differs from eager by {max_diff:.2e}", file=sys.stderr)
            eager_t, compiled_t = timing.alternating_timing(
                lambda: model(x), lambda: compiled(x), warmup=args.warmup, repeats=args.repeats,
                names=("eager", name))
            rows.append({
                "run_id": run_id, "variant": name, "options": repr(options),
                "height": args.height, "width": args.width, "batch": 1,
                "compile_first_call_s": round(compile_s, 3),
                "kernels": generated.kernel_count,
                "generated_launches": generated.launches["generated"],
                "extern_calls": len(generated.extern_calls),
                "max_abs_diff": max_diff, "same_peaks": same_peaks,
                "eager_median_ms": eager_t.median_ms, "eager_q1_ms": eager_t.q1_ms,
                "eager_q3_ms": eager_t.q3_ms,
                "compiled_median_ms": compiled_t.median_ms, "compiled_q1_ms": compiled_t.q1_ms,
                "compiled_q3_ms": compiled_t.q3_ms,
                "speedup_over_eager": eager_t.median_ms / compiled_t.median_ms,
                "repeats": args.repeats, "warmup": args.warmup,
            })
            print(f"{name:30s} compile {compile_s:7.1f} s  kernels {generated.kernel_count:4d}  "
                  f"diff {max_diff:.1e}  eager {eager_t.median_ms:8.1f} ms  compiled "
                  f"{compiled_t.median_ms:8.1f} ms  speedup {rows[-1]['speedup_over_eager']:.2f}x",
                  flush=True)
            torch._dynamo.reset()
    results.append_rows(args.out, rows, env=env)
    print(f"appended {len(rows)} rows to {args.out}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
