"""The article's CPU fusion demo as a library behind ``code/03_fusion.py`` (Chapter 2)."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from graphbook.startup.compile_cache import RestartSpec, fresh_process_compile
from graphbook.config import FLOAT32_ROUNDING, FULL_SIZE
from graphbook.measure import probes, timing
from graphbook.record import runs as runs_lib
from graphbook.method.folding import fold_conv_bn

DEFAULT_SIZE = 2 ** 25          # float32 elements per array: 128 MiB, well beyond the private caches
DEFAULT_REPEATS = 7             # the article took the median of 7 runs
DEFAULT_FEATURE_MAP = (64, *FULL_SIZE)  # channels, height, width: BlurBall's full-resolution stem
CHAIN_OPS = 4                   # x*2, +1, relu, *3
FLOAT_BYTES = 4
REPORT_SUFFIX = ".out.txt"       # the report beside its results file: <stem>.out.txt
DEFAULT_RUNS = 3               # independent runs per invocation (the book decides on medians across runs)


# The element-wise chain, four ways (and the fused loop into an output).
# >>> taught on chapters/02_fusion_on_a_laptop_cpu.ipynb: edit it there, then run scripts/export_taught_code.py
def chain(x: torch.Tensor) -> torch.Tensor:
    """The four-op chain ``relu(x*2 + 1) * 3``, eager: every op writes a new tensor."""
    return torch.relu(x * 2 + 1) * 3


def chain_inplace(x: torch.Tensor) -> torch.Tensor:
    """One new tensor, then three in-place ops on it: four passes, one allocation."""
    y = x * 2
    y.add_(1)
    y.relu_()
    y.mul_(3)
    return y


def chain_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The same four passes into a preallocated ``out``: no allocation at all."""
    torch.mul(x, 2, out=out)
    out.add_(1)
    out.relu_()
    out.mul_(3)
    return out


def chain_fused_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """For torch.compile: the fused loop writing into ``out``, so no fresh output is timed with it."""
    out.copy_(chain(x))
    return out
# <<< end of the code taught on chapters/02_fusion_on_a_laptop_cpu.ipynb


def bytes_moved(n_elements: int, ops: int = CHAIN_OPS, fused: bool = False) -> int:
    """Bytes a chain of float32 element-wise ops moves, caches and allocation ignored: ``8N * ops``, fused ``8N``."""
    passes = 1 if fused else ops
    return 2 * FLOAT_BYTES * n_elements * passes


def count_cpp_kernels(code: str) -> int:
    """C++ kernels in Inductor's generated CPU code: one ``async_compile.cpp_pybinding(`` call each."""
    return code.count("async_compile.cpp_pybinding(")


# ---------------------------------------------------------------- (a) BN folding
def _bn_folding_setup(feature_map=DEFAULT_FEATURE_MAP, seed: int = 0) -> tuple[dict, list[dict]]:
    """Conv3x3 + BN and its folded conv on one ``(C, H, W)`` feature map, built and checked once: calls and rows."""
    channels, height, width = feature_map
    torch.manual_seed(seed)
    conv, bn = nn.Conv2d(channels, channels, 3, padding=1, bias=False).eval(), nn.BatchNorm2d(channels).eval()
    with torch.no_grad():  # "trained" statistics, so the fold is not a no-op
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    folded = fold_conv_bn(conv, bn)
    x = torch.randn(1, channels, height, width)
    with torch.no_grad():
        reference, candidate = bn(conv(x)), folded(x)
        max_abs = (reference - candidate).abs().max().item()
        max_rel = max_abs / reference.abs().max().item()
    check = {"part": "bn_folding", "feature_map": "x".join(map(str, feature_map)), "max_abs_diff": max_abs,
             "max_rel_diff": max_rel}
    return ({"unfolded": lambda: bn(conv(x)), "folded": lambda: folded(x)},
            [{"variant": "unfolded", **check}, {"variant": "folded", **check}])


# ---------------------------------------------------------------- (b) the chain, timed
def _chain_setup(n_elements: int = DEFAULT_SIZE, compile_chain: bool = True, seed: int = 0) -> tuple[dict, list[dict]]:
    """The chain's versions on ``n_elements`` floats, built (and compiled) and checked against eager once."""
    torch.manual_seed(seed)
    x = torch.randn(n_elements)
    out = torch.zeros(n_elements)
    expected = chain(x)
    versions = [("eager", lambda: chain(x), False)]
    if compile_chain:
        torch._dynamo.reset()
        compiled = torch.compile(chain)
        compiled_into = torch.compile(chain_fused_into)
        versions.append(("torch.compile", lambda: compiled(x), True))
    versions += [("manual in-place", lambda: chain_inplace(x), False),
                 ("preallocated out=", lambda: chain_into(x, out), False)]
    if compile_chain:
        versions.append(("torch.compile, out=", lambda: compiled_into(x, out), True))
    checks = [{"variant": name, "part": "chain", "size_elements": n_elements,
               "model_bytes": bytes_moved(n_elements, fused=fused),
               "max_abs_diff": (fn() - expected).abs().max().item()}  # correctness first (also compiles)
              for name, fn, fused in versions]
    return {name: fn for name, fn, _ in versions}, checks


PROBE = "copy_ (bandwidth probe)"


def measure_runs(feature_map=DEFAULT_FEATURE_MAP, n_elements: int = DEFAULT_SIZE, repeats: int = DEFAULT_REPEATS,
                 runs: int = DEFAULT_RUNS, compile_chain: bool = True, seed: int = 0, progress=None) -> pd.DataFrame:
    """BN folding and the chain's versions in ``runs`` rotated runs, beside each run's ``copy_`` probe."""
    fold_calls, fold_checks = _bn_folding_setup(feature_map, seed)
    chain_calls, chain_checks = _chain_setup(n_elements, compile_chain, seed)

    def copy_probe() -> dict:
        copy = probes.copy_bandwidth(nbytes=n_elements * FLOAT_BYTES, repeats=repeats)
        return {"copy_gbps": copy["gb_per_s"],
                **{f"copy_{k}": copy[k] for k in ("median_ms", "min_ms", "max_ms", "times_ms")}}

    with torch.no_grad():
        calls = {**fold_calls, **chain_calls}
        timed = pd.DataFrame(timing.repeated_runs(list(calls), timing.one_by_one(calls, warmup=2, repeats=repeats),
                                                  runs=runs, probe=copy_probe, log=progress,
                                                  groups=[list(fold_calls), list(chain_calls)]))
    frame = timed.merge(pd.DataFrame(fold_checks + chain_checks), on="variant", how="left")
    by_part = frame.groupby(["run", "part"], sort=False)
    frame["run_order"], frame["went_first"] = by_part.cumcount() + 1, by_part["variant"].transform("first")

    def per_run(variant):  # each row's run's median of ``variant``
        return frame["median_ms"].where(frame["variant"] == variant).groupby(frame["run"]).transform("max")
    chain_rows = frame["part"] == "chain"
    frame.loc[chain_rows, "gb_per_s"] = frame["model_bytes"] / (frame["median_ms"] * 1e-3) / 1e9
    frame.loc[chain_rows, "share_of_copy"] = frame["gb_per_s"] / frame["copy_gbps"]
    frame.loc[chain_rows, "speedup_vs_eager"] = per_run("eager") / frame["median_ms"]
    folded = frame["variant"] == "folded"
    frame.loc[folded, "change_pct"] = (per_run("unfolded") - frame["median_ms"]) / per_run("unfolded") * 100
    copy_ms = ["copy_median_ms", "copy_min_ms", "copy_max_ms", "copy_times_ms"]
    probe = (frame[chain_rows].drop_duplicates("run")
             [["run", "run_count", "run_started", "went_first", "copy_gbps", "part", "size_elements", *copy_ms]]
             .rename(columns=lambda c: c.removeprefix("copy_") if c in copy_ms else c)
             .assign(variant=PROBE, model_bytes=2 * n_elements * FLOAT_BYTES, gb_per_s=lambda f: f["copy_gbps"],
                     share_of_copy=1.0, run_order=0))
    frame = pd.concat([frame.drop(columns=copy_ms), probe])
    return frame.sort_values(["run", "part", "run_order"], kind="stable", ignore_index=True)


# ---------------------------------------------------------------- the chain from in-cache to DRAM
def cache_levels(env: dict) -> dict[str, int]:
    """The CPU's data caches from a fingerprint, in bytes: ``L1d``, ``L2``, ``L3`` (those it recorded)."""
    kib = {name: pd.to_numeric(env.get(column) or 0, errors="coerce")
           for name, column in (("L1d", "cpu_l1d_kib"), ("L2", "cpu_l2_kib"), ("L3", "cpu_l3_kib"))}
    return {name: int(k) * 1024 for name, k in kib.items() if k > 0}


def chain_size_sweep(exponents=(10, 12, 14, 16, 18, 20, 22, 24, 26), *, runs: int = 3, env: dict | None = None):
    """Eager against compiled on the chain from in-cache sizes to far beyond, beside the bytes-moved model's factor."""
    compiled = torch.compile(chain)
    rows = []
    for exponent in exponents:
        n = 2 ** int(exponent)
        x = torch.randn(n)
        if not torch.allclose(compiled(x), chain(x), rtol=FLOAT32_ROUNDING, atol=FLOAT32_ROUNDING):
            raise AssertionError(f"the compiled chain differs from eager at n = 2^{exponent}")
        repeats = 30 if n <= 2 ** 18 else 10 if n <= 2 ** 22 else 4
        pair = timing.live_runs({"eager": lambda: chain(x), "compiled": lambda: compiled(x)}, runs=runs,
                                warmup=3, repeats=repeats, env=env)
        ratios = next(iter(runs_lib.paired_ratios(pair, "compiled", "eager").values()))
        medians = runs_lib.summarize_runs(pair).set_index("variant")["median"]
        rows.append({"elements": n, "array_bytes": n * FLOAT_BYTES, "eager_ms": float(medians["eager"]),
                     "compiled_ms": float(medians["compiled"]), "speedup": statistics.median(ratios),
                     "speedup_min": min(ratios), "speedup_max": max(ratios),
                     "model_speedup": bytes_moved(n) / bytes_moved(n, fused=True)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- (c) compile time, cold and warm
class Chain(nn.Module):
    """:func:`chain` as a module, for a fresh process to build by name and compile."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return chain(x)


def measure_compile_time(n_elements: int = DEFAULT_SIZE, threads: int = 1, runs: int = 3) -> pd.DataFrame:
    """Compile time of :func:`chain` in fresh processes per run: a new empty cache (cold), then the same (warm)."""
    spec = RestartSpec(f"{__name__}:Chain", (n_elements,), (1,), threads=threads)
    rows = []
    for run in range(1, runs + 1):
        with tempfile.TemporaryDirectory(prefix="fusion-inductor-cache-") as directory:
            for order, variant in enumerate(("cold", "warm"), start=1):
                child = fresh_process_compile(spec, directory)
                rows.append({"part": "compile_time", "variant": variant, "run": run, "run_order": order,
                             "size_elements": n_elements, "compile_s": child["first_call_s"]["1"],
                             "fxgraph_cache_hit": child["fxgraph_cache_hit"],
                             "fxgraph_cache_miss": child["fxgraph_cache_miss"]})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- report and records
def _format_report(env: dict, frame: pd.DataFrame, compile_frame: pd.DataFrame | None) -> str:
    """The text of the demo's report (``<results file stem>.out.txt``): the environment header, then parts (a), (b)
    and (c)."""
    lines = ["# code/03_fusion.py output", "# environment"]
    lines += [f"#   {key}: {value}" for key, value in env.items()]
    folds = frame[frame["part"] == "bn_folding"].pivot(index="run", columns="variant", values="median_ms")
    fold = frame[frame["variant"] == "folded"].set_index("run")
    c, h, w = fold["feature_map"].iloc[0].split("x")
    lines += ["", f"(a) BN folding: conv3x3 {c}->{c} + BatchNorm2d on a 1x{c}x{h}x{w} feature map",
              f"    max abs difference folded vs unfolded: {fold['max_abs_diff'].iloc[0]:.3g} "
              f"(relative {fold['max_rel_diff'].iloc[0]:.3g})"]
    lines += [f"    run {run}: conv+BN {row.unfolded:.2f} ms, folded {row.folded:.2f} ms -> "
              f"{fold.at[run, 'change_pct']:+.1f}% time saved ({fold.at[run, 'went_first']} timed first)"
              for run, row in folds.iterrows()]
    chain_rows = frame[frame["part"] == "chain"]
    copy = chain_rows[chain_rows["variant"] == PROBE]
    n, runs = int(chain_rows["size_elements"].iloc[0]), len(copy)
    lines += ["", f"(b) element-wise chain relu(x*2 + 1)*3 on N = {n} float32 ({n * 4 / 2**20:.0f} MiB per array), "
              f"{runs} run{'s' if runs != 1 else ''} in a rotated order (medians across runs; min and max: the runs' medians)",
              f"    copy_ bandwidth (median of the runs' probes): {copy['gb_per_s'].median():.2f} GB/s "
              f"({copy['median_ms'].median():.2f} ms per copy); per run "
              + ", ".join(f"{v:.2f}" for v in copy["gb_per_s"]) + " GB/s"]
    versions = chain_rows[chain_rows["variant"] != PROBE].groupby("variant", sort=False).agg(**{
        "median ms": ("median_ms", "median"), "min ms": ("median_ms", "min"), "max ms": ("median_ms", "max"),
        "model MB": ("model_bytes", lambda b: b.iloc[0] / 1e6), "GB/s": ("gb_per_s", "median"),
        "of copy": ("share_of_copy", "median"), "vs eager": ("speedup_vs_eager", "median"),
        "max|diff|": ("max_abs_diff", "first")})
    lines += ["    " + line for line in versions.to_string(float_format="{:.3g}".format).splitlines()]
    lines.append("")
    if compile_frame is None:
        lines.append("(c) compile time: skipped (--no-compile)")
    else:
        pairs = compile_frame.pivot(index="run", columns="variant")
        ratios = pairs["compile_s"]["warm"] / pairs["compile_s"]["cold"]
        lines.append("(c) compile time of the chain, first call in a fresh process (each run its own empty cache)")
        lines += [f"    run {run}: empty cache {pair['compile_s', 'cold']:.2f} s (FX graph cache misses "
                  f"{pair['fxgraph_cache_miss', 'cold']}), warm cache {pair['compile_s', 'warm']:.2f} s (hits "
                  f"{pair['fxgraph_cache_hit', 'warm']}), {ratios[run]:.2f} of the cold time"
                  for run, pair in pairs.iterrows()]
        lines.append(f"    median warm/cold ratio: {ratios.median():.2f}")
    return "\n".join(lines) + "\n"


def write_report(results_csv: str | Path, env: dict, frame: pd.DataFrame,
                 compile_frame: pd.DataFrame | None) -> Path:
    """Write the report beside the run's results file, ``<its stem>.out.txt``, and return its path: a recording
    keeps it with the rows it summarizes, and no run writes over another's."""
    path = Path(results_csv).with_suffix(REPORT_SUFFIX)
    with path.open("x") as handle:
        handle.write(_format_report(env, frame, compile_frame))
    return path


def failed_checks(frame: pd.DataFrame, atol: float) -> list[str]:
    """Versions whose output differs from the reference (conv + BN, or the eager chain) by more than ``atol``."""
    failed = frame[(frame["max_abs_diff"] > atol) & (frame["variant"] != "unfolded")]
    return ["folded conv" if name == "folded" else name for name in failed["variant"].unique()]
