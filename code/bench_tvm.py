"""What a tuning-based compiler costs: BlurBall in TVM, untuned and briefly tuned, against eager (Chapter 3).

BlurBall goes through ``torch.export`` and TVM's PyTorch frontend (``graphbook.tvm_compare.relax_module``),
is built for ``llvm`` with TVM's default pipeline (no tuning: its built-in CPU schedules, which do not
cover convolution and run single-threaded), and, with ``--trials N``, tuned with MetaSchedule for N
measured trials in all (random cost model, one build worker, ``--build-timeout`` seconds per build: each
worker imports TVM's tensor intrinsics once, which alone can take half a minute on two cores). Eager
PyTorch runs right before each variant. Each variant's output is compared with eager
(``correctness.compare_to_reference``). One new ``cpu-tvm-<date>.csv`` per run (kind ``tvm``).

Tuning stays out of the chapters' execution time; Chapter 3 shows the recorded run.

Usage::

    python code/bench_tvm.py                            # untuned only, 32x64
    python code/bench_tvm.py --trials 64 --height 96 --width 160

Exit status: 0 recorded; 1 a TVM variant's output differs from eager (still recorded); 2 bad arguments;
3 TVM is not installed here (requirements-tvm.txt; x86-64 Linux wheels only).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from graphbook.record.cli import OneLineParser, multiple_of_8, positive_int


def parse_args(argv=None):
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=multiple_of_8, default=32)
    parser.add_argument("--width", type=multiple_of_8, default=64)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed calls per variant (median)")
    parser.add_argument("--trials", type=int, default=0,
                        help="MetaSchedule trials in all; 0 (default) skips tuning")
    parser.add_argument("--build-timeout", type=positive_int, default=120, help="seconds per MetaSchedule build")
    parser.add_argument("--results-dir", default=None,
                        help="where the result file goes (default data/results, or $GRAPHBOOK_RESULTS_DIR)")
    args = parser.parse_args(argv)
    if args.trials < 0:
        parser.error("--trials must be 0 or more")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    from graphbook import tvm_compare

    ok, why = tvm_compare.tvm_status()
    if not ok:
        print(f"bench_tvm: error: {why}", file=sys.stderr)
        return 3
    import torch
    import tvm
    from tvm import relax

    from graphbook import blurball
    from graphbook.record import environment, results, timing
    from graphbook import correctness

    torch.set_num_threads(args.threads)
    env = environment.fingerprint(args.threads)  # taken first: a run of minutes must not fail at the end
    env["tvm"] = tvm.__version__
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    with torch.no_grad():
        reference = model(x)
    eager = lambda: model(x)  # noqa: E731

    def run_eager():
        with torch.no_grad():
            return eager()

    mod = tvm_compare.relax_module(model, x)
    target = tvm.target.Target({"kind": "llvm", "num-cores": args.threads})
    data = tvm.runtime.tensor(x.numpy())
    rows, failed = [], []

    def record(name, executable, build_s, note, **extra):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        call = lambda: vm["main"](data)  # noqa: E731
        output = call()
        output = output[0] if not hasattr(output, "numpy") else output
        verdict = correctness.compare_to_reference(torch.from_numpy(output.numpy()), reference)
        eager_ms = timing.time_cpu(run_eager, warmup=1, repeats=args.repeats).median_ms
        tvm_ms = timing.time_cpu(call, warmup=1, repeats=args.repeats).median_ms
        rows.append({results.VARIANT: name, "eager_median_ms": round(eager_ms, 2),
                     results.MEDIAN_MS: round(tvm_ms, 2), results.SPEEDUP_VS_EAGER: round(eager_ms / tvm_ms, 4),
                     results.MAX_ABS_DIFF: verdict["max_abs_diff"], results.SAME_OUTPUT: verdict["same_output"],
                     results.COMPILE_S: round(build_s, 1), "note": note, "height": args.height,
                     "width": args.width, "batch": 1, "repeats": args.repeats, **extra})
        print(rows[-1], flush=True)
        if not verdict["same_output"]:
            failed.append(name)

    start = time.perf_counter()
    executable = tvm.compile(mod, target=target)
    record("tvm_untuned", executable, time.perf_counter() - start,
           "TVM default pipeline, no tuning (built-in schedules, single-threaded convolutions)")

    if args.trials:
        from tvm.s_tir import meta_schedule as ms

        # MetaSchedule tunes TIR functions: legalize and fuse first (the same passes tvm.compile runs), so
        # each fused kernel is one task.
        fused = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
            relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
        with tempfile.TemporaryDirectory(prefix="graphbook-ms-") as work_dir:
            start = time.perf_counter()
            try:
                database = ms.relax_integration.tune_relax(
                    fused, params={}, target=target, work_dir=work_dir, max_trials_global=args.trials,
                    num_trials_per_iter=min(16, args.trials), cost_model="random",
                    builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=args.build_timeout),
                    runner=ms.runner.LocalRunner(timeout_sec=60), database="json", seed=0)
                tune_s = time.perf_counter() - start
                tasks = len(ms.relax_integration.extract_tasks(fused, target))
                start = time.perf_counter()
                executable = ms.relax_integration.compile_relax(database, fused, target, params=None)
                record("tvm_tuned", executable, tune_s + time.perf_counter() - start,
                       f"MetaSchedule, {args.trials} trials over {tasks} tasks, random cost model",
                       tune_s=round(tune_s, 1), trials=args.trials, tasks=tasks)
            except Exception as error:  # a tuning failure is a result too: record why
                rows.append({results.VARIANT: "tvm_tuned", "note": f"tuning failed: {type(error).__name__}: "
                             f"{str(error).splitlines()[0][:300] if str(error) else ''}",
                             "tune_s": round(time.perf_counter() - start, 1), "trials": args.trials,
                             "height": args.height, "width": args.width})
                print(rows[-1], file=sys.stderr, flush=True)

    return results.write_and_report("tvm", rows, env, results_dir=args.results_dir,
                                    failure=f"bench_tvm: {', '.join(failed)} differ from eager" if failed else None)


if __name__ == "__main__":
    sys.exit(main())
