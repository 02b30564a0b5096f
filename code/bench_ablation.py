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

Each run writes a new file ``cpu-ablation-<date>[-N].csv`` under ``--results-dir`` (default
``data/results/``; ``graphbook.results.write_run``, never an existing file) with the environment columns;
the runs recorded before, in ``ablation_cpu.csv``, are read back by ``results.load("ablation")``. Exit
status (``graphbook.cli``): 0 ok; 1 a configuration's output differs from eager FP32 (checked with
``results.compare_to_reference``; the rows are still written); 2 bad arguments.
A cold run costs several minutes on 2 cores (four BlurBall compiles); a warm cache, about one.
"""
from __future__ import annotations

import sys
import time
import uuid

from graphbook import cli
from graphbook.cli import positive_int, multiple_of_8


def parse_args(argv=None):
    from graphbook.inductor_tools import ABLATION_CONFIGS

    parser = cli.make_parser("bench_ablation.py", __doc__.splitlines()[0])
    parser.add_argument("--height", type=multiple_of_8, default=96, help="input height (default 96)")
    parser.add_argument("--width", type=multiple_of_8, default=160, help="input width (default 160)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls per variant")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed calls per variant")
    parser.add_argument("--variants", default=",".join(ABLATION_CONFIGS),
                        help="comma-separated subset of: " + "; ".join(ABLATION_CONFIGS))
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in ABLATION_CONFIGS]
    if unknown or not names:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(ABLATION_CONFIGS)}")
    args.variants = names
    return args


def run(args) -> tuple[list[dict], list[str]]:
    """Compile, check, count and time every requested configuration; write one new results file.
    Returns the rows and the configurations whose output differs from eager FP32."""
    import torch

    from graphbook import blurball, inductor_tools, results, timing
    from graphbook.results import COMPILE_S, MAX_ABS_DIFF, SAME_OUTPUT, SAME_PEAKS, SPEEDUP_VS_EAGER
    from graphbook.environment import fingerprint, set_threads

    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    run_id = uuid.uuid4().hex[:8]
    rows, failed = [], []
    with torch.no_grad():
        reference = model(x)
        for name in args.variants:
            options = inductor_tools.ablation_options(name)
            start = time.perf_counter()
            generated = inductor_tools.compile_and_get_code(model, x, options=options)
            compile_s = time.perf_counter() - start
            compiled = generated.compiled
            check = results.compare_to_reference(generated.output, reference)
            max_diff = check[MAX_ABS_DIFF]
            if not check[SAME_OUTPUT]:  # every configuration is FP32: all are expected to match
                failed.append(name)
            eager_t, compiled_t = timing.alternating_timing(
                lambda: model(x), lambda: compiled(x), warmup=args.warmup, repeats=args.repeats,
                names=("eager", name))
            rows.append({
                "run_id": run_id, "variant": name, "options": repr(options),
                "height": args.height, "width": args.width, "batch": 1,
                COMPILE_S: round(compile_s, 3),
                "kernels": generated.kernel_count,
                "generated_launches": generated.launches["generated"],
                "extern_calls": len(generated.extern_calls),
                MAX_ABS_DIFF: max_diff, SAME_OUTPUT: check[SAME_OUTPUT], SAME_PEAKS: check[SAME_PEAKS],
                "eager_median_ms": eager_t.median_ms, "eager_q1_ms": eager_t.q1_ms,
                "eager_q3_ms": eager_t.q3_ms,
                "compiled_median_ms": compiled_t.median_ms, "compiled_q1_ms": compiled_t.q1_ms,
                "compiled_q3_ms": compiled_t.q3_ms,
                SPEEDUP_VS_EAGER: eager_t.median_ms / compiled_t.median_ms,
                "repeats": args.repeats, "warmup": args.warmup,
            })
            print(f"{name:30s} compile {compile_s:7.1f} s  kernels {generated.kernel_count:4d}  "
                  f"diff {max_diff:.1e}  eager {eager_t.median_ms:8.1f} ms  compiled "
                  f"{compiled_t.median_ms:8.1f} ms  speedup {rows[-1][SPEEDUP_VS_EAGER]:.2f}x",
                  flush=True)
            torch._dynamo.reset()
    path = results.write_run("ablation", rows, env, results_dir=args.results_dir)
    print(f"wrote {len(rows)} rows to {path}")
    return rows, failed


if __name__ == "__main__":
    sys.exit(cli.run_checked("bench_ablation.py", parse_args, run))
