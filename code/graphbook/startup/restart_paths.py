"""How long a fresh process takes to its first correct output, per restart path (Chapter 6). Each output is
checked against eager FP32 (a fast wrong answer is not a restart path); the children run
:mod:`graphbook.startup.restart_child`, so the ONNX Runtime and OpenVINO ones never import torch."""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from graphbook.startup.aoti_cpp import build_cpp_loader
from graphbook.startup.compile_cache import run_child, start_child
from graphbook.startup.restart_child import RestartPathError
from graphbook.config import BATCH_SIZES, FULL_SIZE, THREADS
from graphbook.measure.compiletime import seconds_to_ready
from graphbook.model.blurball import build_blurball
from graphbook.paths import script
from graphbook.record import results
from graphbook import checks
from graphbook.runtimes.onnx_utils import op_counts
from graphbook.runtimes.openvino_runtime import available as openvino_available

KIND = "restart-paths"


#: Each path as prose names it (Chapters 6, 7).
LABELS = {"eager": "eager (no compile)", "compile-cold": "torch.compile, cold",
          "compile-warm": "torch.compile, warm cache", "compile-artifacts": "torch.compile, cache artifacts",
          "aoti-static": "AOTInductor .pt2, batch 1", "aoti-static-vec-isa-ok": ".pt2, batch 1, ISA probe skipped",
          "aoti-static-probe-cached": ".pt2, batch 1, probe cached", "aoti-dynamic": "AOTInductor .pt2, batch 1-3",
          "aoti-dynamic-vec-isa-ok": ".pt2, batch 1-3, probe skipped",
          "aoti-cpp": "AOTInductor .pt2, C++ loader, batch 1", "aoti-cpp-dynamic": ".pt2, C++ loader, batch 1-3",
          "ort-raw": "ONNX Runtime, raw .onnx",
          "ort-optimized-onnx": "ONNX Runtime, saved optimized .onnx", "ort-optimized-ort": "ONNX Runtime, saved .ort",
          "ort-dynamic": "ONNX Runtime, .onnx batch 1-3",
          "openvino": "OpenVINO, raw .onnx (compiled at start)",
          "openvino-cached": "OpenVINO, .onnx + model cache"}


@dataclass(frozen=True)
class RestartPath:
    """One way to get a model running in a new process: ``cache`` is the Inductor cache a ``compile`` child gets
    (``empty``, ``warm`` or ``artifacts``); ``tied_to`` is what must match between building and loading machine."""

    name: str
    runtime: str
    artifact: str | None = None
    cache: str | None = None
    level: str = "all"
    env: dict = field(default_factory=dict)
    batch_sizes: tuple[int, ...] = (1,)
    tied_to: str = ""


_TORCH = "torch version (and Python for the compile caches)"
PATHS: tuple[RestartPath, ...] = (
    RestartPath("eager", "eager", "checkpoint", tied_to="the checkpoint only (any torch that loads it)"),
    RestartPath("compile-cold", "compile", "checkpoint", cache="empty",
                tied_to="nothing saved; needs a C++ compiler at start-up"),
    RestartPath("compile-warm", "compile", "checkpoint", cache="warm",
                tied_to=f"{_TORCH}, CPU vector ISA (part of the cache key); needs g++ at start-up"),
    RestartPath("compile-artifacts", "compile", "checkpoint", cache="artifacts",
                tied_to=f"{_TORCH}, CPU vector ISA; the artifacts hold C++ source, so g++ compiles again"),
    RestartPath("aoti-static", "aoti", "aoti-static",
                tied_to="torch version (package ABI), CPU vector ISA the kernels were compiled for, batch 1"),
    # aoti_load_package builds a small C++ file per candidate vector ISA only to answer a check: VEC_ISA_OK skips the
    # base check, but on AVX-512 the sub-feature checks still build, into the cache the probe-cached path keeps.
    RestartPath("aoti-static-vec-isa-ok", "aoti", "aoti-static", env={"TORCHINDUCTOR_VEC_ISA_OK": "1"},
                tied_to="as aoti-static; the env var skips the g++ ISA probe, so no compiler is needed"),
    RestartPath("aoti-static-probe-cached", "aoti", "aoti-static", cache="probe",
                env={"TORCHINDUCTOR_VEC_ISA_OK": "1"},
                tied_to="as aoti-static; the Inductor cache directory already holds the ISA probe's "
                        "builds (e.g. baked into the container image)"),
    RestartPath("aoti-dynamic", "aoti", "aoti-dynamic", batch_sizes=BATCH_SIZES,
                tied_to="torch version, CPU vector ISA; batch 1..3"),
    RestartPath("aoti-dynamic-vec-isa-ok", "aoti", "aoti-dynamic", env={"TORCHINDUCTOR_VEC_ISA_OK": "1"},
                batch_sizes=BATCH_SIZES, tied_to="as aoti-dynamic, no g++ probe"),
    RestartPath("aoti-cpp", "aoti-cpp", "aoti-static",
                tied_to="as aoti-static, plus the libtorch the loader was linked against (same torch wheel); "
                        "g++ only once, to build the loader"),
    RestartPath("aoti-cpp-dynamic", "aoti-cpp", "aoti-dynamic", batch_sizes=BATCH_SIZES,
                tied_to="as aoti-dynamic, plus the libtorch the loader was linked against"),
    RestartPath("ort-raw", "ort", "onnx-raw", level="all",
                tied_to="ONNX opset (any ORT that supports it); portable across CPUs"),
    RestartPath("ort-optimized-onnx", "ort", "onnx-optimized", level="disabled",
                tied_to="ORT version (com.microsoft contrib ops) and this CPU (NCHWc layout, ORT docs: not portable)"),
    RestartPath("ort-optimized-ort", "ort", "ort-format", level="disabled",
                tied_to="ORT format version (ORT >= 1.14 reads v5) and this CPU (NCHWc layout)"),
    RestartPath("ort-dynamic", "ort", "onnx-dynamic", level="all", batch_sizes=BATCH_SIZES,
                tied_to="ONNX opset; portable; batch 1..3 from one session"),
    RestartPath("openvino", "openvino", "onnx-raw",
                tied_to="ONNX opset (any OpenVINO that reads it); portable; compiled for this CPU at every start"),
    RestartPath("openvino-cached", "openvino", "onnx-raw", cache="openvino",
                tied_to="OpenVINO version and this CPU (the cached blob is compiled for it; a mismatch recompiles)"),
)
PATH_BY_NAME = {p.name: p for p in PATHS}
PATH_NAMES = tuple(PATH_BY_NAME)


# -- Parent: reference, builds, fresh-process loads --
def _file_bytes(path: Path) -> int:
    """Size of an artifact on disk: a file plus its ``.data`` sibling (ONNX external weights)."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return sum(p.stat().st_size for p in (path, data) if p.is_file())


def _prepare_reference(work: Path, checkpoint, input_hw, batch_sizes=BATCH_SIZES, seed: int = 0) -> dict:
    """Seeded inputs and eager FP32 outputs per batch size, saved as ``.npy`` in ``work``."""
    model = build_blurball(checkpoint)
    gen = torch.Generator().manual_seed(seed)
    refs = {}
    with torch.no_grad():
        for b in batch_sizes:
            x = torch.randn(b, 9, *input_hw, generator=gen)
            np.save(work / f"input-b{b}.npy", x.numpy())
            refs[b] = model(x).numpy()
    return refs


def _build_artifacts(work: Path, checkpoint, threads: int = THREADS, timeout: float = 1800.0,
                    which=("onnx", "aoti-static", "aoti-dynamic")) -> dict:
    """Build every artifact in its own fresh process and empty cache, so its cost is what a build machine pays."""
    base = {"role": "build", "work": str(work), "checkpoint": str(checkpoint), "threads": threads}
    built = {}
    if "onnx" in which:
        onnx_t = run_child({**base, "what": "onnx"}, cache_dir=work / "cache-build-onnx", timeout=timeout)
        export_s = onnx_t["export_s"]
        for key, file, build_s in (("onnx-raw", "raw.onnx", export_s),
                                   ("onnx-dynamic", "dynamic.onnx", onnx_t["export_dynamic_s"]),
                                   ("onnx-optimized", "optimized.onnx", export_s + onnx_t["optimize_onnx_s"]),
                                   ("ort-format", "optimized.ort", export_s + onnx_t["optimize_ort_s"])):
            built[key] = {"path": work / file, "build_s": build_s, "bytes": _file_bytes(work / file)}
        # operators by domain: NCHWc ones are CPU-layout specific (MLAS picks the block size from the CPU it runs
        # on); the ORT-format file holds the same optimized graph (the onnx package cannot read it)
        by_domain = Counter()
        for (domain, _op), n in op_counts(built["onnx-optimized"]["path"]).items():
            by_domain[domain] += n
        layout = {"nchwc_ops": by_domain["com.microsoft.nchwc"], "contrib_ops": by_domain["com.microsoft"],
                  "total_ops": by_domain.total()}
        built["onnx-optimized"].update(layout)
        built["ort-format"].update(layout)
    for what in ("aoti-static", "aoti-dynamic"):
        if what not in which:
            continue
        t = run_child({**base, "what": what}, cache_dir=work / f"cache-build-{what}", timeout=timeout)
        built[what] = {"path": work / f"{what}.pt2", "build_s": t["export_s"] + t["compile_s"],
                       "export_s": t["export_s"], "bytes": _file_bytes(work / f"{what}.pt2")}
    return built


def _measure_path(path: RestartPath, work: Path, repeat: int, *, checkpoint, artifacts: dict,
                 threads: int = THREADS, steady_runs: int = 5, timeout: float = 1800.0) -> dict:
    """One fresh-process start of ``path``; the first cold start (repeat 0) saves the cache artifacts."""
    out_dir = work / "outputs" / f"{path.name}-{repeat}"
    spec = {"role": "load", "name": path.name, "runtime": path.runtime, "level": path.level,
            "batch_sizes": list(path.batch_sizes), "work": str(work), "out_dir": str(out_dir),
            "threads": threads, "steady_runs": steady_runs}
    cache_dir = None
    if path.runtime in ("eager", "compile"):
        spec["artifact_path"] = str(checkpoint)
    else:
        spec["artifact_path"] = str(artifacts[path.artifact]["path"])
    if path.runtime in ("compile", "aoti", "eager"):
        cache_dir = work / "caches" / f"{path.name}-{repeat}"
    if path.cache == "probe":
        cache_dir = work / "caches" / "aoti-probe"
    if path.runtime == "compile":
        if path.cache == "empty" and repeat == 0:
            cache_dir = work / "caches" / "warm"
            spec["save_artifacts"] = str(work / "cache-artifacts.bin")
        elif path.cache == "warm":
            cache_dir = work / "caches" / "warm"
        elif path.cache == "artifacts":
            spec["load_artifacts"] = str(work / "cache-artifacts.bin")
    if path.cache == "openvino":  # one folder for every start: the first (untimed) start filled it
        spec["openvino_cache_dir"] = str(work / "caches" / "openvino")
    if path.runtime == "aoti-cpp":  # the C++ loader prints the same GRAPHBOOK_RESULT line as a Python child
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(artifacts["cpp-loader"]["path"]), spec["artifact_path"], spec["work"], spec["out_dir"],
               repr(time.time()), str(threads), str(steady_runs), *(str(b) for b in path.batch_sizes)]
        result = start_child(cmd, {**os.environ, "OMP_NUM_THREADS": str(threads)}, path.name, "C++ loader", timeout)
    else:
        result = run_child(spec, path.env, cache_dir=cache_dir, timeout=timeout)
    result["out_dir"] = str(out_dir)
    return result


def run_restart_paths(checkpoint, *, input_hw=FULL_SIZE, repeats: int = 3, threads: int = THREADS,
                      paths=PATH_NAMES, steady_runs: int = 5, workdir=None, timeout: float = 1800.0,
                      progress=None, server_repeats: int = 0, server_rows: list | None = None) -> list[dict]:
    """Build the artifacts, then start every path in ``repeats`` fresh processes, one row per start. Starts are
    interleaved by round, so a slow phase of a shared machine spreads over all paths."""
    say = progress or (lambda msg: None)
    chosen = [PATH_BY_NAME[n] for n in paths]
    ov_ok, ov_why = openvino_available() if any(p.runtime == "openvino" for p in chosen) else (True, "")
    if not ov_ok:  # no wheel for this platform: the other paths still run, and the rows show which are absent
        say(f"skipping the OpenVINO paths: {ov_why}")
        chosen = [p for p in chosen if p.runtime != "openvino"]
    own_tmp = tempfile.TemporaryDirectory(prefix="graphbook-restart-") if workdir is None else None
    work = Path(own_tmp.name if own_tmp else workdir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        say(f"reference: eager FP32 at {input_hw[0]}x{input_hw[1]}")
        refs = _prepare_reference(work, checkpoint, input_hw)
        artifacts = {}
        if any(p.runtime in ("aoti", "aoti-cpp", "ort", "openvino") for p in chosen):
            say("building artifacts (ONNX export + ORT optimization, AOTInductor static and dynamic)")
            which = {"onnx" if p.runtime in ("ort", "openvino") else p.artifact for p in chosen
                     if p.runtime in ("aoti", "aoti-cpp", "ort", "openvino")}
            artifacts = _build_artifacts(work, checkpoint, threads, timeout, which=tuple(which))
            if any(p.runtime == "aoti-cpp" for p in chosen):
                artifacts["cpp-loader"] = build_cpp_loader(work)
            for key, info in artifacts.items():
                say(f"  {key}: {info['build_s']:.1f} s, {info['bytes'] / 1e6:.1f} MB")
        # one untimed start leaves the ISA probe's builds (or OpenVINO's compiled blob) in the cache the path keeps
        for cache, name, doing in (("probe", "aoti-static-probe-cached",
                                    "priming an Inductor cache directory with the vector-ISA probe"),
                                   ("openvino", "openvino-cached", "filling OpenVINO's model cache")):
            if any(p.cache == cache for p in chosen):
                say(f"{doing} (untimed)")
                _measure_path(PATH_BY_NAME[name], work, -1, checkpoint=checkpoint, artifacts=artifacts,
                              threads=threads, steady_runs=1, timeout=timeout)
        rows = []
        for repeat in range(repeats):
            # compile-cold first (it fills the warm cache and saves the artifacts the others load)
            for path in sorted(chosen, key=lambda p: p.name != "compile-cold"):
                res = _measure_path(path, work, repeat, checkpoint=checkpoint, artifacts=artifacts,
                                   threads=threads, steady_runs=steady_runs, timeout=timeout)
                compared = [checks.compare_to_reference(np.load(Path(res["out_dir"]) / f"out-b{b}.npy"), refs[b])
                          for b in path.batch_sizes]
                art = artifacts.get(path.artifact, {})
                build_s = art.get("build_s")
                artifact_bytes = art.get("bytes")
                if path.runtime == "eager":
                    build_s, artifact_bytes = 0.0, _file_bytes(Path(checkpoint))
                elif path.runtime == "aoti-cpp":  # the loader is built once per torch version; counted here
                    build_s = build_s + artifacts["cpp-loader"]["build_s"]
                elif path.runtime == "compile":
                    warm = work / "caches" / "warm"
                    artifact_bytes = ((work / "cache-artifacts.bin").stat().st_size if path.cache == "artifacts"
                                      else sum(p.stat().st_size for p in warm.rglob("*") if p.is_file())
                                      if path.cache == "warm" else 0)
                    build_s = None
                steady = res["steady_s"]
                row = {
                    "path": path.name, "runtime": path.runtime, "repeat": repeat,
                    "input_hw": f"{input_hw[0]}x{input_hw[1]}",
                    "batch_sizes": ",".join(map(str, path.batch_sizes)),
                    "first_output_s": res["first_output_s"], "ready_s": res["ready_s"],
                    "interpreter_s": res["interpreter_s"], "import_s": res["import_s"], "load_s": res["load_s"],
                    "first_call_s": res["first_call_s"][str(path.batch_sizes[0])],
                    "steady_median_ms": 1e3 * statistics.median(steady),
                    "steady_min_ms": 1e3 * min(steady), "steady_max_ms": 1e3 * max(steady),
                    "steady_times_ms": tuple(1e3 * s for s in steady),
                    "process_wall_s": res["process_wall_s"],
                    results.MAX_ABS_DIFF: max(c[results.MAX_ABS_DIFF] for c in compared),
                    results.SAME_OUTPUT: all(c[results.SAME_OUTPUT] for c in compared),
                    results.SAME_PEAKS: all(c.get(results.SAME_PEAKS, True) for c in compared),
                    "torch_imported": bool(res["torch_imported"]),
                    "build_s": build_s, "artifact_bytes": artifact_bytes,
                    "nchwc_ops": art.get("nchwc_ops"), "contrib_ops": art.get("contrib_ops"),
                    "env_overrides": " ".join(f"{k}={v}" for k, v in path.env.items()),
                    "loadavg_1m": res.get("loadavg_1m"),
                    "tied_to": path.tied_to,
                }
                rows.append(row)
                with (work / "rows.jsonl").open("a") as log:  # a record that survives a failure later on
                    log.write(json.dumps(row, default=str) + "\n")
                say(f"  [{repeat}] {path.name:>24}: first correct output {row['first_output_s']:7.2f} s "
                    f"(import {row['import_s']:.2f}, load {row['load_s']:.2f}, first call "
                    f"{row['first_call_s']:.2f}), steady {row['steady_median_ms']:.0f} ms, "
                    f"diff {row[results.MAX_ABS_DIFF]:.1e}")
        if server_repeats and server_rows is not None:
            say("time to ready of serve_blurball.py started from the model and from the artifacts")
            try:
                # the server starts the chosen paths correspond to: eager, and the compile with its saved artifacts
                names = {p.name for p in chosen}
                model_servers = [name for name, wanted in (("eager", "eager" in names),
                                                           ("compile cold", "compile-cold" in names),
                                                           ("compile from saved cache artifacts", "compile-cold" in names))
                                 if wanted]
                server_rows.extend(_server_readiness(artifacts, work, input_hw, repeats=server_repeats, threads=threads,
                                                     timeout=timeout, progress=say, model_servers=model_servers))
            except RestartPathError as exc:  # the restart rows are still worth keeping
                say(f"server readiness failed: {str(exc).strip().splitlines()[-1]}")
        cold = [r for r in rows if r["path"] == "compile-cold"]
        if cold:  # the cold compile is the compile paths' build cost
            cold_median = statistics.median(r["first_output_s"] for r in cold)
            for r in rows:
                if r["runtime"] == "compile":
                    r["build_s"] = cold_median
        return rows
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()


# ---- Time to ready of the book's server in a fresh process (Chapter 7's readiness table)
def _time_server_to_ready(server_args: list[str], *, threads: int = THREADS, env_extra: dict | None = None,
                         cache_dir=None, timeout: float = 600.0) -> float:
    """Seconds from launching ``code/serve_blurball.py`` with ``server_args`` on a free port to its READY line."""
    env = dict(os.environ)
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    env.update(env_extra or {})
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    cmd = [sys.executable, str(script("serve_blurball.py")), "--port", "0", "--threads", str(threads),
           *map(str, server_args)]
    return seconds_to_ready(cmd, env=env, timeout=timeout, error=RestartPathError)


#: Server variants started from the artifacts: name -> (artifact key, batch sizes, extra env).
ARTIFACT_SERVERS = {
    "aoti .pt2 (dynamic batch)": ("aoti-dynamic", BATCH_SIZES, {}),
    "aoti .pt2 (dynamic batch), TORCHINDUCTOR_VEC_ISA_OK=1": ("aoti-dynamic", BATCH_SIZES,
                                                              {"TORCHINDUCTOR_VEC_ISA_OK": "1"}),
    "onnxruntime .onnx (dynamic batch)": ("onnx-dynamic", BATCH_SIZES, {}),
    "onnxruntime .ort (optimized, batch 1)": ("ort-format", (1,), {}),
}


#: Server variants started from the model itself, batch sizes 1-3: name -> extra arguments ({saved} is the file
#: of Inductor cache artifacts the cold compile saves and the next start loads).
MODEL_SERVERS = {
    "eager": (),
    "compile cold": ("--compile", "--save-artifacts", "{saved}"),
    "compile from saved cache artifacts": ("--compile", "--load-artifacts", "{saved}"),
}


def _server_readiness(artifacts: dict, work: Path, input_hw, *, repeats: int = 3, threads: int = THREADS,
                     timeout: float = 600.0, progress=None, model_servers=tuple(MODEL_SERVERS)) -> list[dict]:
    """Time the server to ready from the model and from each built artifact, ``repeats`` times (Chapter 7)."""
    say = progress or (lambda msg: None)
    rows = []
    all_sizes = ",".join(map(str, BATCH_SIZES))
    size_args = ["--height", input_hw[0], "--width", input_hw[1], "--batch-sizes", all_sizes]
    for repeat in range(repeats):
        saved = work / f"server-cache-artifacts-{repeat}.bin"
        for name, extra in ((n, MODEL_SERVERS[n]) for n in model_servers):
            seconds = _time_server_to_ready([*size_args, *(a.format(saved=saved) for a in extra)], threads=threads,
                                           cache_dir=work / "caches" / f"server-{name.replace(' ', '-')}-{repeat}",
                                           timeout=timeout)
            rows.append({"model": "blurball", "input_chw": f"9x{input_hw[0]}x{input_hw[1]}", "batch_sizes": all_sizes,
                         "server": name, "time_to_ready_s": seconds, "repeat": repeat,
                         "artifact_bytes": saved.stat().st_size if "artifacts" in name and saved.exists() else None})
            say(f"  [{repeat}] server {name}: ready after {seconds:.2f} s")
        for name, (key, sizes, env_extra) in ARTIFACT_SERVERS.items():
            if key not in artifacts:
                continue
            seconds = _time_server_to_ready(
                ["--artifact", artifacts[key]["path"], "--height", input_hw[0], "--width", input_hw[1],
                 "--batch-sizes", ",".join(map(str, sizes))], threads=threads, env_extra=env_extra,
                cache_dir=work / "caches" / f"server-{key}-{len(env_extra)}-{repeat}", timeout=timeout)
            rows.append({"model": "blurball", "input_chw": f"9x{input_hw[0]}x{input_hw[1]}",
                         "batch_sizes": ",".join(map(str, sizes)), "server": name, "time_to_ready_s": seconds,
                         "repeat": repeat, "artifact_bytes": artifacts[key]["bytes"]})
            say(f"  [{repeat}] server {name}: ready after {seconds:.2f} s")
    return rows


def summarize(frame, baseline: str = "compile-cold"):
    """One row per path of a recorded run: first-output median and spread, ratio to ``baseline``, steady, sizes."""
    if frame.empty:
        return pd.DataFrame()
    table = frame.assign(same_output=frame["same_output"].astype(bool)).groupby("path", sort=False).agg(
        starts=("first_output_s", "size"), first_output_median_s=("first_output_s", "median"),
        first_output_min_s=("first_output_s", "min"), first_output_max_s=("first_output_s", "max"),
        import_median_s=("import_s", "median"), load_median_s=("load_s", "median"),
        first_call_median_s=("first_call_s", "median"), steady_median_ms=("steady_median_ms", "median"),
        build_s=("build_s", "first"), artifact_bytes=("artifact_bytes", "first"), same_output=("same_output", "all"),
        tied_to=("tied_to", "first"))
    base = frame.loc[frame["path"] == baseline, "first_output_s"].astype(float)
    table["speedup_vs_cold"] = base.median() / table["first_output_median_s"]
    table["speedup_vs_cold_min"] = base.min() / table["first_output_max_s"]
    table["artifact_mb"] = table.pop("artifact_bytes").astype(float) / 1e6
    return table.reset_index()
