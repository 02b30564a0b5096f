"""What TVM's untuned build costs: BlurBall in TVM for generic x86-64 and the host CPU, eager at 1 and N threads."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

from graphbook.compilers import tvm_build
from graphbook.measure import environment, timing
from graphbook.model import blurball
from graphbook.record import cli, results
from graphbook.record.cli import int_at_least, positive_int
from graphbook.runtimes import correctness
from graphbook.teach import tvm_compare

PROG = "bench_tvm.py"
COLUMNS = ["run", "variant", "note", "target", "variant_threads", "tvm_num_threads", "height", "width", "batch",
           "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "busy_cores", "speedup_vs_eager",
           "speedup_vs_eager_1_thread", "max_abs_diff", "same_output", "compile_s", "parallel_launches",
           "ir_lines_f32x4", "ir_lines_f32x8", "ir_lines_f32x16", "ir_lines_gather", "tune_s", "trials", "tasks",
           "run_order", "went_first", "run_count", "run_started", "copy_gbps"]


def parse_args(argv=None):
    parser = cli.make_parser(PROG, __doc__.splitlines()[0])
    cli.add_input_size(parser, (32, 64))
    cli.add_run_protocol_options(parser, repeats=10, warmup=2)
    parser.add_argument("--trials", type=int_at_least(0), default=0,
                        help="MetaSchedule trials in all, tuned for the host CPU; 0 (default) skips tuning")
    parser.add_argument("--build-timeout", type=positive_int, default=120, help="seconds per MetaSchedule build")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # TVM's thread pool reads this when it starts; a build without parallel loops never starts it
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))

    ok, why = tvm_compare.tvm_status()
    if not ok:
        return cli.resource_absent(PROG, f"error: {why}")
    import tvm
    from tvm import relax

    environment.set_threads(args.threads)
    env = environment.fingerprint(args.threads)  # taken first: a run of minutes must not fail at the end
    env["tvm"] = tvm.__version__
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    with torch.no_grad():
        reference = model(x)
    data = tvm.runtime.tensor(x.numpy())
    calls, torch_threads, built, failed = {}, {}, {}, []

    def run_eager():
        with torch.no_grad():
            return model(x)

    def add(name, call, output, note, threads, **columns):
        """Check ``name`` against eager once, before any timing, and keep what its rows carry."""
        verdict = correctness.compare_to_reference(output, reference)
        calls[name] = call
        built[name] = {"variant": name, "note": note, "variant_threads": threads, "height": args.height,
                       "width": args.width, "batch": 1, results.MAX_ABS_DIFF: verdict["max_abs_diff"],
                       results.SAME_OUTPUT: verdict["same_output"], **columns}
        print(f"{name}: built and checked, max|diff| {verdict['max_abs_diff']:.2e}", flush=True)
        if not verdict["same_output"]:
            failed.append(name)

    def add_tvm(name, executable, target, note, **columns):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        call = lambda: vm["main"](data)
        output = call()
        output = output if hasattr(output, "numpy") else output[0]
        add(name, call, torch.from_numpy(output.numpy()), note, int(os.environ["TVM_NUM_THREADS"]),
            target=str(target), tvm_num_threads=os.environ["TVM_NUM_THREADS"],
            **tvm_build.generated_code(executable), **columns)

    for name, threads in ((tvm_build.EAGER, args.threads), (tvm_build.EAGER_1_THREAD, 1)):
        torch.set_num_threads(threads)
        add(name, run_eager, run_eager(), f"eager PyTorch, {threads} intra-op thread{'s' if threads > 1 else ''}",
            threads)
        torch_threads[name] = threads
    torch.set_num_threads(args.threads)

    mod = tvm_compare.relax_module(model, x)
    untuned_targets = tvm_build.targets(args.threads)
    notes = {tvm_build.GENERIC: "TVM default pipeline, untuned, llvm without mcpu (generic x86-64)",
             tvm_build.HOST: "TVM default pipeline, untuned, llvm for the host CPU"}
    for name, target in untuned_targets.items():
        start = time.perf_counter()
        executable = tvm.compile(mod, target=target)
        add_tvm(name, executable, target, notes[name], compile_s=round(time.perf_counter() - start, 1))

    failure_rows = []
    if args.trials:
        target = untuned_targets[tvm_build.HOST]
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="graphbook-ms-") as work_dir:
            try:
                executable, info = tvm_build.tune(mod, target, trials=args.trials, build_timeout=args.build_timeout,
                                                  work_dir=work_dir)
                add_tvm(tvm_build.TUNED, executable, target,
                        f"MetaSchedule for the host CPU, {info['trials']} trials over {info['tasks']} tasks, "
                        "random cost model", compile_s=round(time.perf_counter() - start, 1), **info)
            except Exception as error:  # a tuning failure is a result too: record why (one row, no run)
                first_line = str(error).splitlines()[0][:300] if str(error) else ""
                failure_rows.append({"variant": tvm_build.TUNED, "target": str(target), "trials": args.trials,
                                     "note": f"tuning failed: {type(error).__name__}: {first_line}",
                                     "tune_s": round(time.perf_counter() - start, 1), "height": args.height,
                                     "width": args.width})
                print(failure_rows[-1], file=sys.stderr, flush=True)

    timed = timing.repeated_runs(
        calls, runs=args.runs, warmup=args.warmup, repeats=args.repeats, log=lambda line: print(line, flush=True),
        measure=lambda name, _run: tvm_build.timed_with_cores(calls[name], warmup=args.warmup, repeats=args.repeats,
                                                              threads=torch_threads.get(name)))
    rows = tvm_build.add_speedups([{**row, **built[row["variant"]]} for row in timed]) + failure_rows
    rows = [{c: row.get(c, "") for c in COLUMNS} for row in rows]
    path = results.write_run("tvm", rows, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(rows)} rows ({args.runs} runs) to {path}")
    return cli.exit_status_for(PROG, failed)


if __name__ == "__main__":
    sys.exit(main())
