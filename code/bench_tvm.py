"""What TVM's untuned build costs: BlurBall in TVM for generic x86-64 and the host CPU, eager at 1 and N threads."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import torch

from graphbook.compilers import tvm_build
from graphbook.measure import environment
from graphbook.method.bench import build_check_time
from graphbook.method.variants import VariantUnavailable
from graphbook.model import blurball
from graphbook.record import cli, results
from graphbook.record.cli import int_at_least, positive_int
from graphbook.teach import tvm_compare

PROG = "bench_tvm.py"


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
    mod = tvm_compare.relax_module(model, x)
    targets = tvm_build.targets(args.threads)
    targets[tvm_build.TUNED] = targets[tvm_build.HOST]
    tvm_threads, threads = int(os.environ["TVM_NUM_THREADS"]), {tvm_build.EAGER: args.threads,
                                                                  tvm_build.EAGER_1_THREAD: 1}
    calls = {}  # each version's own call: its timing counts the cores it keeps busy

    def eager(name):
        calls[name] = lambda: model(x)
        return lambda: ((lambda _x: calls[name]()), {
            "note": f"eager PyTorch, {threads[name]} intra-op thread" + "s" * (threads[name] > 1)})

    def tvm_version(name, note, build=lambda target: (tvm.compile(mod, target=target), {})):
        def built():
            start = time.perf_counter()
            executable, info = build(targets[name])
            vm = relax.VirtualMachine(executable, tvm.cpu())
            calls[name] = lambda: vm["main"](data)
            first = lambda out: out if hasattr(out, "numpy") else out[0]
            return (lambda _x: torch.from_numpy(first(calls[name]()).numpy())), {
                "note": note.format(**info), "compile_s": round(time.perf_counter() - start, 1),
                **tvm_build.generated_code(executable), **info}
        return built

    def tune(target):
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="graphbook-ms-") as work_dir:
            try:
                return tvm_build.tune(mod, target, trials=args.trials, build_timeout=args.build_timeout,
                                      work_dir=work_dir)
            except Exception as error:  # a tuning failure is a result too: its rows say why
                first_line = str(error).splitlines()[0][:300] if str(error) else ""
                raise VariantUnavailable(f"tuning failed after {time.perf_counter() - start:.1f} s: "
                                         f"{type(error).__name__}: {first_line}") from error

    builders = {tvm_build.EAGER: eager(tvm_build.EAGER), tvm_build.EAGER_1_THREAD: eager(tvm_build.EAGER_1_THREAD),
                tvm_build.GENERIC: tvm_version(tvm_build.GENERIC, "TVM default pipeline, untuned, llvm without mcpu "
                                                                  "(generic x86-64)"),
                tvm_build.HOST: tvm_version(tvm_build.HOST, "TVM default pipeline, untuned, llvm for the host CPU")}
    if args.trials:
        builders[tvm_build.TUNED] = tvm_version(tvm_build.TUNED, "MetaSchedule for the host CPU, {trials} trials over "
                                                "{tasks} tasks, random cost model", tune)
    columns = {name: {"variant_threads": threads.get(name, tvm_threads), "height": args.height, "width": args.width,
                      "batch": 1, **({"target": str(targets[name]), "tvm_num_threads": tvm_threads}
                                     if name in targets else {})} for name in builders}
    with torch.no_grad():
        frame, failed = build_check_time(
            builders, x, reference, columns=columns, runs=args.runs, log=lambda line: print(line, flush=True),
            measure=lambda name, _run: tvm_build.timed_with_cores(calls[name], warmup=args.warmup, repeats=args.repeats,
                                                                  threads=threads.get(name)))
    for column, baseline in tvm_build.SPEEDUP_BASELINES.items():  # over each eager of the same run
        frame[column] = frame["median_ms"].where(frame["variant"] == baseline).groupby(
            frame["run"]).transform("max") / frame["median_ms"]
    path = results.write_run("tvm", frame, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(frame)} rows ({args.runs} runs) to {path}")
    return cli.exit_status_for(PROG, failed)


if __name__ == "__main__":
    sys.exit(main())
