"""An Inductor ablation on this CPU, in the spirit of the PyTorch 2 paper's Table 4 (Chapter 3)."""
from __future__ import annotations

import functools
import sys
import time

import torch
from torch._dynamo.utils import counters

from graphbook.compilers import inductor_tools
from graphbook.compilers.inductor_tools import (ABLATION_CONFIGS, CAUSE_ABLATION_CONFIGS, UNFUSED_ABLATION_BACKENDS,
                                                UNFUSED_ABLATION_CONFIGS)
from graphbook.config import SMALL_SIZE
from graphbook.measure import probes, timing
from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball
from graphbook.record import cli, results
from graphbook.record.cli import positive_int
from graphbook.record.results import COMPILE_S, SPEEDUP_VS_EAGER
from graphbook.method import variants
from graphbook.method.bench import build_check_time


def parse_args(argv=None):
    # Every Inductor setting of the ablation, including the row that really turns fusion and inlining off
    # on the C++ backend (max_fusion_size=1 alone leaves BlurBall's launches unchanged there), and the
    # same decomposed graph run op by op by a non-Inductor backend.
    configs = [*ABLATION_CONFIGS, *UNFUSED_ABLATION_CONFIGS, *CAUSE_ABLATION_CONFIGS, *UNFUSED_ABLATION_BACKENDS]
    parser = cli.make_parser("bench_ablation.py", __doc__.splitlines()[0])
    cli.add_input_size(parser, SMALL_SIZE)
    cli.add_run_protocol_options(parser, repeats=10, warmup=3)
    parser.add_argument("--probe-mib", type=positive_int, default=64,
                        help="MiB per buffer of the copy_ bandwidth probe measured in every run (default 64)")
    parser.add_argument("--variants", type=cli.comma_choices(configs, "variant"), default=tuple(configs),
                        help="comma-separated subset of: " + "; ".join(configs))
    return parser.parse_args(argv)


def _unique_graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def run(args) -> tuple[object, list[str]]:
    """Compile and check every configuration once, time them in rotated runs, write one new file: its path, failures."""
    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    compiled = {}

    def build(name):  # on the model's own code object: one Dynamo cache per configuration, no recompile later
        start = time.perf_counter()
        if name in inductor_tools.UNFUSED_ABLATION_BACKENDS:  # no Inductor: no generated code to count
            options = {"backend": inductor_tools.UNFUSED_ABLATION_BACKENDS[name]}
            compiled[name] = torch.compile(variants.own_code(model), backend=options["backend"])
            compiled[name](x)
            counts = {"kernels": 0, "generated_launches": 0, "extern_calls": 0}
        else:
            options = inductor_tools.ablation_options(name)
            generated = inductor_tools.compile_and_get_code(variants.own_code(model), x, options=options, reset=False)
            compiled[name] = generated.compiled
            counts = {"kernels": generated.kernel_count, "generated_launches": generated.launches["generated"],
                      "extern_calls": len(generated.extern_calls)}
        return compiled[name], {"options": repr(options), COMPILE_S: round(time.perf_counter() - start, 3), **counts}

    def against_eager(name: str, index: int) -> dict:
        """One configuration timed in alternated pairs with eager; every second run it goes first."""
        graphs = _unique_graphs()
        pair = {"eager": lambda: model(x), name: lambda: compiled[name](x)}
        timed = timing.interleaved(dict(reversed(pair.items())) if index % 2 else pair, warmup=args.warmup,
                                   repeats=args.repeats)
        eager_t, compiled_t = timed["eager"], timed[name]
        print(f"  {name:30s} eager {eager_t.median_ms:8.1f} ms  compiled {compiled_t.median_ms:8.1f} ms  "
              f"speedup {eager_t.median_ms / compiled_t.median_ms:.2f}x", flush=True)
        return {**{f"eager_{k}": getattr(eager_t, k) for k in ("median_ms", "q1_ms", "q3_ms", "times_ms")},
                **{f"compiled_{k}": getattr(compiled_t, k) for k in ("median_ms", "q1_ms", "q3_ms", "times_ms")},
                SPEEDUP_VS_EAGER: eager_t.median_ms / compiled_t.median_ms, "repeats": args.repeats,
                "warmup": args.warmup, "recompiles": _unique_graphs() - graphs}

    with torch.no_grad():
        reference = model(x)
        torch._dynamo.reset()  # nothing compiled earlier in this process is reused
        frame, failed = build_check_time(
            {name: functools.partial(build, name) for name in args.variants}, x, reference,
            columns={name: {"height": args.height, "width": args.width, "batch": 1} for name in args.variants},
            runs=args.runs, warmup=args.warmup, repeats=args.repeats, probe_bytes=args.probe_mib * probes.MIB,
            measure=against_eager, log=lambda line: print(line, flush=True))
    path = results.write_run("ablation", frame, env, results_dir=args.results_dir, per_run=True)
    if frame["recompiles"].sum():
        print(f"bench_ablation.py: {frame['recompiles'].sum()} recompile(s) during the timed runs (their warm-up "
              "absorbed them)", file=sys.stderr)
    print(f"wrote {len(frame)} rows ({args.runs} runs) to {path}")
    return path, failed


def main(argv: list[str] | None = None) -> int:
    """Parse, run, then the exit status of ``graphbook.record.cli`` (1 when a configuration differs from eager)."""
    _, failed = run(parse_args(argv))
    return cli.exit_status_for("bench_ablation.py", failed)


if __name__ == "__main__":
    sys.exit(main())
