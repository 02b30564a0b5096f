"""BlurBall on the CPU: the measurement matrix of Chapter 5, one variant at a time.

    .venv/bin/python code/bench_blurball_cpu.py                     # every variant, 2 threads
    .venv/bin/python code/bench_blurball_cpu.py --variants eager_fp32,compile_freezing --repeats 5

Batch 1, explicit threads. Each variant is first checked against eager FP32 (max abs diff and the
per-frame heatmap peak positions), then timed with the book's harness (warm-up, median, spread).
Achieved GFLOP/s (2 x MACs counted by hooks / median time) is compared with the matmul peak
measured in the same run, and one eager forward is profiled and grouped like the article's GPU
profile (convolution, batch norm, element-wise, other; ``graphbook.profiling``). All rows go to a new
file ``cpu-blurball-<date>[-N].csv`` under ``--results-dir`` (default ``data/results/``; never an existing
file) and a table is printed. Exit status (``graphbook.cli``): 0 ok; 1 a FP32 variant differs from eager
by more than the tolerance (the results are still written; the variants are named on stderr); 2 bad
arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from graphbook import cli
from graphbook.cli import positive_int, multiple_of_8

VARIANTS = {
    "eager_fp32": "eager, FP32, NCHW (the reference)",
    "eager_fp32_channels_last": "eager, FP32, channels-last (NHWC) model and input",
    "eager_bf16_autocast": "eager, bfloat16 autocast",
    "compile_default": "torch.compile, default mode, freezing off (the default)",
    "compile_freezing": "torch.compile, default mode, inductor freezing on (BN folded, oneDNN convs)",
    "compile_freezing_bf16": "torch.compile with freezing, under bfloat16 autocast",
    "onnxruntime": "ONNX export (default options), ONNX Runtime CPU, default optimisation level",
}
REFERENCE = "eager_fp32"
BF16_VARIANTS = ("eager_bf16_autocast", "compile_freezing_bf16")
# fp32 results that differ by more than this from eager are reported as not matching.
FP32_TOLERANCE = 1e-3


def _variant_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown or [text]}; choose from {', '.join(VARIANTS)}")
    if REFERENCE not in names:  # everything is checked and reported against eager FP32
        names.insert(0, REFERENCE)
    return list(dict.fromkeys(names))


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; bad values exit 2 with one line on stderr (Chapter 5)."""
    parser = cli.make_parser("bench_blurball_cpu.py", "BlurBall CPU measurement matrix (Chapter 5).")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch and ORT intra-op threads")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls per variant")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed calls per variant")
    parser.add_argument("--variants", type=_variant_list, default=list(VARIANTS),
                        help="comma-separated subset of: " + ", ".join(VARIANTS))
    parser.add_argument("--height", type=multiple_of_8, default=288)
    parser.add_argument("--width", type=multiple_of_8, default=512)
    parser.add_argument("--no-profile", action="store_true", help="skip the eager profile")
    parser.add_argument("--peak-n", type=positive_int, default=2048, help="matmul size for the peak")
    return parser.parse_args(argv)


def compare(reference, output) -> dict:
    """Max abs diff and per-frame peak agreement of ``output`` against ``reference`` (Chapter 5)."""
    from graphbook import blurball

    output = output.float()
    return {"max_abs_diff": float((output - reference).abs().max()),
            "peaks_equal": bool((blurball.heatmap_peaks(output) == blurball.heatmap_peaks(reference)).all())}


def _autocast_bf16():
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def build_variant(name: str, model, x, threads: int, workdir: Path):
    """Return ``(call, setup_seconds, note)`` for one variant; ``call()`` runs one forward.

    ``setup_seconds`` is the compile (or export + session) time including the first call, or 0.
    """
    import torch

    from graphbook.compiletime import compile_and_first_call

    if name == "eager_fp32":
        return (lambda: model(x)), 0.0, ""
    if name == "eager_fp32_channels_last":
        import copy

        model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        return (lambda: model_cl(x_cl)), 0.0, ""
    if name == "eager_bf16_autocast":
        def call():
            with _autocast_bf16():
                return model(x)
        return call, 0.0, ""
    if name in ("compile_default", "compile_freezing", "compile_freezing_bf16"):
        import torch._inductor.config as inductor_config

        freezing = name != "compile_default"
        autocast = _autocast_bf16() if name.endswith("bf16") else contextlib.nullcontext()
        with inductor_config.patch(freezing=freezing), autocast:
            compiled, seconds = compile_and_first_call(model, (x,), fresh_cache=False)

        def call():
            with inductor_config.patch(freezing=freezing), (
                    _autocast_bf16() if name.endswith("bf16") else contextlib.nullcontext()):
                return compiled(x)
        return call, seconds, "freezing on" if freezing else "freezing off"
    if name == "onnxruntime":
        import onnxruntime as ort

        start = time.perf_counter()
        path = workdir / "blurball.onnx"
        torch.onnx.export(model, (x,), str(path), external_data=False)  # default exporter and options
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name
        feed = {input_name: x.numpy()}
        session.run(None, feed)
        seconds = time.perf_counter() - start

        def call():
            return torch.from_numpy(session.run(None, feed)[0])
        level = str(options.graph_optimization_level).split(".")[-1]
        return call, seconds, f"ORT {ort.__version__}, {level}"
    raise ValueError(f"unknown variant {name!r}")


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of the variant rows."""
    lines = [f"{'variant':28s} {'median ms':>10s} {'IQR ms':>8s} {'x eager':>8s} {'GFLOP/s':>8s} "
             f"{'% peak':>7s} {'max|diff|':>10s} {'peaks':>6s} {'setup s':>8s}"]
    for r in rows:
        if not r.get("median_ms"):
            lines.append(f"{r['variant']:28s} skipped: {r.get('note', '')}")
            continue
        share = r.get("share_of_peak")
        lines.append(f"{r['variant']:28s} {r['median_ms']:10.1f} {r['q3_ms'] - r['q1_ms']:8.1f} "
                     f"{r['speedup_vs_eager_fp32']:8.2f} {r['gflop_per_s']:8.1f} "
                     f"{(100 * share if share != '' else float('nan')):7.1f} {r['max_abs_diff']:10.2e} "
                     f"{'same' if r['peaks_equal'] else 'DIFF':>6s} {r['setup_s']:8.1f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Measure every requested variant and write the rows to a new CSV; returns its path and the
    FP32 variants that failed their check against eager."""
    import torch

    from graphbook import blurball, probes, results
    from graphbook.environment import fingerprint, set_threads
    from graphbook.profiling import profile_eager, variant_rows
    from graphbook.timing import time_cpu

    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    cost = blurball.model_cost(model, x)
    with torch.no_grad():
        reference = model(x).float()
    margin = blurball.peak_margin(reference)
    bf16_ok, bf16_reason = probes.bf16_support()

    peaks = {"fp32": probes.matmul_peak(n=args.peak_n, repeats=5)["gflop_per_s"]}
    if bf16_ok:
        peaks["bf16"] = probes.matmul_peak(n=args.peak_n, dtype=torch.bfloat16, repeats=5)["gflop_per_s"]
    common = {"batch": 1, "height": args.height, "width": args.width, "macs": cost.macs,
              "dead_macs": cost.dead_macs, "parameters": cost.parameters, "peak_margin": margin}
    measured, failed = [], []
    with tempfile.TemporaryDirectory(prefix="bench_blurball_") as tmp:
        for name in args.variants:
            precision = "bf16" if name in BF16_VARIANTS else "fp32"
            base = {"record": "variant", "variant": name, "description": VARIANTS[name],
                    "precision": precision, **common}
            if precision == "bf16" and not bf16_ok:
                measured.append({**base, "note": f"skipped: {bf16_reason}"})
                print(f"{name}: skipped ({bf16_reason})", flush=True)
                continue
            print(f"{name}: building and checking ...", flush=True)
            with torch.no_grad():
                call, setup_s, note = build_variant(name, model, x, args.threads, Path(tmp))
                check = compare(reference, call())
                if precision == "fp32" and check["max_abs_diff"] > FP32_TOLERANCE:
                    note = (note + "; " if note else "") + f"max abs diff above {FP32_TOLERANCE:g}"
                    failed.append(name)
                timing = time_cpu(call, warmup=args.warmup, repeats=args.repeats, name=name)
            measured.append({**base, **timing.as_dict(), **check, "setup_s": setup_s,
                             "note": note or (bf16_reason if precision == "bf16" else "")})
            print(f"  median {timing.median_ms:.1f} ms, max abs diff {check['max_abs_diff']:.2e}, "
                  f"peaks {'same' if check['peaks_equal'] else 'DIFFERENT'}", flush=True)
    rows = variant_rows(measured, cost.macs, peaks)
    for precision, value in peaks.items():
        rows.append({"record": "peak", "variant": f"matmul_{precision}", "precision": precision,
                     "peak_gflop_per_s": value, "note": f"{args.peak_n}x{args.peak_n} matmul"})
    if not args.no_profile:
        for group in profile_eager(model, x):
            rows.append({"record": "profile", "variant": REFERENCE, "precision": "fp32",
                         "category": group["category"], "ops": group["ops"],
                         "profile_ms": group["ms"], "share": group["share"]})
    path = results.write_run("cpu-blurball", rows, env, results_dir=args.results_dir)
    print()
    print(format_table([r for r in rows if r["record"] == "variant"]))
    print(f"\nMACs per forward {cost.macs / 1e9:.2f} G ({cost.dead_macs / 1e9:.2f} G in never-read "
          f"stage-4 outputs); peaks: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()))
    print(f"bf16: {bf16_reason}")
    print(f"wrote {path}")
    return path, failed


def main(argv=None) -> int:
    args = parse_args(argv)
    _, failed = run(args)
    return cli.exit_status_for("bench_blurball_cpu.py", failed)


if __name__ == "__main__":
    sys.exit(main())
