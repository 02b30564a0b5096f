"""An Inductor ablation on this CPU, in the spirit of the PyTorch 2 paper's Table 4 (Chapter 3).

    .venv/bin/python code/bench_ablation.py                          # 96x160 input, 2 threads
    .venv/bin/python code/bench_ablation.py --height 288 --width 512 --repeats 5
    .venv/bin/python code/bench_ablation.py --runs 5                   # five timed runs instead of three

BlurBall (batch 1) is compiled four times: all optimizations (freezing on), without fusion
(``max_fusion_size=1``), without freezing, and without both (see ``graphbook.compilers.inductor_tools.
ABLATION_CONFIGS`` for why these switches). Each variant is compiled ONCE, on its own copy of the
model whose ``forward`` has its own code object, so Dynamo keeps one cache per variant and the runs
reuse the compiled code without a reset or a recompile (the ``recompiles`` column counts any). Per
variant, once:

1. compile and first call (seconds; a cold or warm Inductor cache, as found);
2. correctness against eager FP32: max abs diff and the per-frame heatmap peak positions;
3. kernels generated (definitions in the code), their launches per call, and library calls.

Then ``--runs`` independent timed runs (default and minimum 3), each measuring every variant once in an
order that rotates between runs (round-robin), plus the ``copy_`` bandwidth (``copy_gbps``) as the run's
physical reference: eager and compiled calls alternate, one each per repeat (compiled first in every
second run), so every speedup is a ratio of medians taken under the same background load. Rows carry
``run``, ``run_order`` (1 = went first) and ``run_id`` ``<file stem>/r<run>`` (``graphbook.record.runs``
counts each run on its own); ``compile_s``, the kernel counts and the check are per build, the same
in every run.

Each run writes a new file ``cpu-ablation-<date>[-N].csv`` under ``--results-dir`` (default
``data/results/``; ``graphbook.record.results.write_run``, never an existing file) with the environment columns;
the runs recorded before, in ``ablation_cpu.csv``, are read back by ``results.load("ablation")``. Exit
status (``graphbook.record.cli``): 0 ok; 1 a configuration's output differs from eager FP32 (checked with
``correctness.compare_to_reference``; the rows are still written); 2 bad arguments.
A cold run costs several minutes on 2 cores (four BlurBall compiles, once each); a warm cache, about
one; each extra run adds the timed calls only.
"""
from __future__ import annotations

import sys
import time

from graphbook.record import cli
from graphbook.record.cli import positive_int


def parse_args(argv=None):
    from graphbook.compilers.inductor_tools import (
        ABLATION_CONFIGS,
        CAUSE_ABLATION_CONFIGS,
        UNFUSED_ABLATION_BACKENDS,
        UNFUSED_ABLATION_CONFIGS,
    )

    # Every Inductor setting of the ablation, including the row that really turns fusion and inlining off
    # on the C++ backend (max_fusion_size=1 alone leaves BlurBall's launches unchanged there), and the
    # same decomposed graph run op by op by a non-Inductor backend.
    configs = [*ABLATION_CONFIGS, *UNFUSED_ABLATION_CONFIGS, *CAUSE_ABLATION_CONFIGS, *UNFUSED_ABLATION_BACKENDS]
    parser = cli.make_parser("bench_ablation.py", __doc__.splitlines()[0])
    cli.add_input_size(parser, height=96, width=160)
    cli.add_run_protocol_options(parser, repeats=10, warmup=3,
                                 runs_help="every variant once per run in a rotated order")
    parser.add_argument("--probe-mib", type=positive_int, default=64,
                        help="MiB per buffer of the copy_ bandwidth probe measured in every run (default 64)")
    parser.add_argument("--variants", default=",".join(configs),
                        help="comma-separated subset of: " + "; ".join(configs))
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in configs]
    if unknown or not names:
        parser.error(f"unknown variant(s) {unknown}; choose from {configs}")
    args.variants = names
    return args


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run(args) -> tuple[list[dict], list[str]]:
    """Compile and check every requested configuration once, time them all in ``args.runs`` rotated runs,
    write one new results file. Returns the rows and the configurations whose output differs from eager FP32."""
    import torch

    from graphbook.compilers import inductor_tools
    from graphbook.measure import probes, timing
    from graphbook.measure.environment import fingerprint, set_threads
    from graphbook.model import blurball
    from graphbook.record import results
    from graphbook.record.results import COMPILE_S, MAX_ABS_DIFF, SAME_OUTPUT, SAME_PEAKS, SPEEDUP_VS_EAGER
    from graphbook.runtimes import correctness, variants

    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    builds, failed, rows = {}, [], []
    with torch.no_grad():
        reference = model(x)
        torch._dynamo.reset()  # nothing compiled earlier in this process is reused
        for name in args.variants:  # compile and check each configuration ONCE
            start = time.perf_counter()
            if name in inductor_tools.UNFUSED_ABLATION_BACKENDS:  # no Inductor: no generated code to count
                options = {"backend": inductor_tools.UNFUSED_ABLATION_BACKENDS[name]}
                compiled_fn = torch.compile(variants.own_code(model), backend=options["backend"])
                output = compiled_fn(x)
                kernels, launches, extern = 0, 0, 0
            else:
                options = inductor_tools.ablation_options(name)
                generated = inductor_tools.compile_and_get_code(variants.own_code(model), x, options=options,
                                                                reset=False)
                compiled_fn, output = generated.compiled, generated.output
                kernels, launches = generated.kernel_count, generated.launches["generated"]
                extern = len(generated.extern_calls)
            compile_s = time.perf_counter() - start
            check = correctness.compare_to_reference(output, reference)
            if not check[SAME_OUTPUT]:  # every configuration is FP32: all are expected to match
                failed.append(name)
            builds[name] = {"compiled": compiled_fn, "row": {
                "variant": name, "options": repr(options), "height": args.height, "width": args.width, "batch": 1,
                COMPILE_S: round(compile_s, 3), "kernels": kernels, "generated_launches": launches,
                "extern_calls": extern,
                MAX_ABS_DIFF: check[MAX_ABS_DIFF], SAME_OUTPUT: check[SAME_OUTPUT], SAME_PEAKS: check[SAME_PEAKS]}}
            print(f"{name:30s} compile {compile_s:7.1f} s  kernels {kernels:4d}  "
                  f"diff {check[MAX_ABS_DIFF]:.1e}", flush=True)
        def against_eager(name: str, index: int) -> dict:
            """One configuration timed in alternated pairs with eager; every second run it goes first."""
            compiled = builds[name]["compiled"]
            graphs = _unique_graphs()
            pair = {"eager": lambda: model(x), name: lambda: compiled(x)}
            if index % 2:
                pair = dict(reversed(list(pair.items())))
            timed = timing.interleaved(pair, warmup=args.warmup, repeats=args.repeats)
            eager_t, compiled_t = timed["eager"], timed[name]
            print(f"  {name:30s} eager {eager_t.median_ms:8.1f} ms  compiled {compiled_t.median_ms:8.1f} ms  "
                  f"speedup {eager_t.median_ms / compiled_t.median_ms:.2f}x", flush=True)
            return {**builds[name]["row"],
                    "eager_median_ms": eager_t.median_ms, "eager_q1_ms": eager_t.q1_ms, "eager_q3_ms": eager_t.q3_ms,
                    "compiled_median_ms": compiled_t.median_ms, "compiled_q1_ms": compiled_t.q1_ms,
                    "compiled_q3_ms": compiled_t.q3_ms, SPEEDUP_VS_EAGER: eager_t.median_ms / compiled_t.median_ms,
                    "repeats": args.repeats, "warmup": args.warmup, "recompiles": _unique_graphs() - graphs}

        # independent timed runs: nothing is recompiled, the order rotates
        rows = timing.repeated_runs({name: builds[name]["compiled"] for name in args.variants}, runs=args.runs,
                                    warmup=args.warmup, repeats=args.repeats, probe_bytes=args.probe_mib * probes.MIB,
                                    measure=against_eager, log=lambda line: print(line, flush=True))
    rows.sort(key=lambda r: (r[results.RUN], args.variants.index(r["variant"])))  # each run in variant order
    path = results.write_run("ablation", rows, env, results_dir=args.results_dir, per_run=True)
    recompiled = sum(r["recompiles"] for r in rows)
    if recompiled:
        print(f"bench_ablation.py: {recompiled} recompile(s) during the timed runs (their warm-up absorbed them)",
              file=sys.stderr)
    print(f"wrote {len(rows)} rows ({args.runs} runs) to {path}")
    return rows, failed


if __name__ == "__main__":
    sys.exit(cli.run_checked("bench_ablation.py", parse_args, run))
