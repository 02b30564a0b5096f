"""The fresh process of a restart path (Chapter 6): import the runtime, load or build the artifact, answer."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

RESULT_MARKER = "GRAPHBOOK_RESULT "


class RestartPathError(RuntimeError):
    """A fresh-process build or load failed; the child's stderr tail is in the message (Chapter 6)."""


def _load_inputs(work: Path, batch_sizes):
    import numpy as np

    return {b: np.load(work / f"input-b{b}.npy") for b in batch_sizes}


def _child_load(spec: dict) -> dict:
    """Runs in the fresh process: import the runtime, load the artifact, run each batch size."""
    launched = float(spec["launched_at"])
    started = time.time()
    work = Path(spec["work"])
    runtime = spec["runtime"]
    sizes = [int(b) for b in spec["batch_sizes"]]
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"interpreter_s": started - launched, "loadavg_1m": os.getloadavg()[0]}
    t0 = time.perf_counter()
    if runtime == "ort":
        import numpy as np
        import onnxruntime as ort

        from graphbook.runtimes.ort_sessions import session_options

        result["import_s"] = time.perf_counter() - t0
        inputs = _load_inputs(work, sizes)
        t0 = time.perf_counter()
        options = session_options(level=spec["level"], threads=int(spec["threads"]))
        session = ort.InferenceSession(spec["artifact_path"], options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        result["load_s"] = time.perf_counter() - t0

        def run(b):
            return session.run(None, {name: inputs[b]})[0]
    elif runtime == "openvino":
        import numpy as np
        import openvino  # noqa: F401 - its import is what this path pays first

        from graphbook.runtimes.openvino_runtime import compile_model, run_compiled

        result["import_s"] = time.perf_counter() - t0
        inputs = _load_inputs(work, sizes)
        t0 = time.perf_counter()
        compiled = compile_model(spec["artifact_path"], threads=int(spec["threads"]),
                                 cache_dir=spec.get("openvino_cache_dir"))
        result["load_s"] = time.perf_counter() - t0

        def run(b):
            return run_compiled(compiled, inputs[b])
    else:
        import importlib

        import numpy as np
        import torch
        from torch._dynamo.utils import counters

        result["import_s"] = time.perf_counter() - t0
        torch.set_num_threads(int(spec["threads"]))
        torch.manual_seed(int(spec.get("seed", 0)))
        inputs = {b: torch.from_numpy(a) for b, a in _load_inputs(work, sizes).items()}
        t0 = time.perf_counter()
        if runtime == "aoti":
            fn = torch._inductor.aoti_load_package(spec["artifact_path"])
        else:
            # any model by its factory ("module:function"), BlurBall by its checkpoint
            if "factory" in spec:
                module, _, name = spec["factory"].partition(":")
                model = getattr(importlib.import_module(module), name)(**spec.get("factory_kwargs", {})).eval()
            else:
                from graphbook.model.blurball import build_blurball

                model = build_blurball(spec["artifact_path"])
            fn = model
            if runtime == "compile":
                result["load_artifacts_s"] = 0.0
                if spec.get("load_artifacts"):
                    loaded = time.perf_counter()
                    torch.compiler.load_cache_artifacts(Path(spec["load_artifacts"]).read_bytes())
                    result["load_artifacts_s"] = time.perf_counter() - loaded
                counters.clear()
                fn = torch.compile(model, backend=spec.get("backend", "inductor"))
        result["load_s"] = time.perf_counter() - t0

        def run(b):
            with torch.no_grad():
                return fn(inputs[b]).numpy()
    outputs = {}
    first_call, graphs_after = {}, {}
    for i, b in enumerate(sizes):
        t0 = time.perf_counter()
        outputs[b] = run(b)
        first_call[str(b)] = time.perf_counter() - t0
        if runtime == "compile":
            graphs_after[str(b)] = int(counters["stats"]["unique_graphs"])
        if i == 0:
            result["first_output_s"] = time.time() - launched
    result["ready_s"] = time.time() - launched
    result["first_call_s"] = first_call
    result["steady_s"] = []
    for _ in range(int(spec["steady_runs"])):
        t0 = time.perf_counter()
        run(sizes[0])
        result["steady_s"].append(time.perf_counter() - t0)
    if runtime == "compile":
        result.update(graphs_after=graphs_after, fxgraph_cache_hit=int(counters["inductor"]["fxgraph_cache_hit"]),
                      fxgraph_cache_miss=int(counters["inductor"]["fxgraph_cache_miss"]), torch=torch.__version__)
    if spec.get("save_artifacts"):
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RestartPathError("torch.compiler.save_cache_artifacts() returned nothing")
        Path(spec["save_artifacts"]).write_bytes(saved[0])
        result["artifact_bytes"] = len(saved[0])
        result["artifact_kinds"] = {kind: len(keys) for kind, keys in saved[1].artifacts.items()}
    for b, out in outputs.items():
        np.save(out_dir / f"out-b{b}.npy", out)
    result["torch_imported"] = "torch" in sys.modules
    return result


def _child_build(spec: dict) -> dict:
    """Runs in a fresh process: build one artifact kind and time each step."""
    import torch

    from graphbook.model.blurball import build_blurball
    from graphbook.runtimes import onnx_utils

    torch.set_num_threads(int(spec["threads"]))
    work = Path(spec["work"])
    model = build_blurball(spec["checkpoint"])
    x1, x2 = (torch.from_numpy(a) for a in _load_inputs(work, (1, 2)).values())
    what = spec["what"]
    times: dict[str, float] = {}
    if what in ("aoti-static", "aoti-dynamic"):
        from torch.export import Dim

        t0 = time.perf_counter()
        if what == "aoti-static":
            program = torch.export.export(model, (x1,))
        else:  # a batch-1 example specialises size 1; export from batch 2 with a named range
            program = torch.export.export(model, (x2,), dynamic_shapes=({0: Dim("batch", min=1, max=3)},))
        times["export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # freezing off, as in the default compile the other torch paths use: the paths compare starts
        torch._inductor.aoti_compile_and_package(program, package_path=str(work / f"{what}.pt2"),
                                                 inductor_configs={"freezing": False})
        times["compile_s"] = time.perf_counter() - t0
    elif what == "onnx":
        import onnxruntime as ort

        t0 = time.perf_counter()
        onnx_utils.export_onnx(model, x1, work / "raw.onnx")
        times["export_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        onnx_utils.export_dynamic_batch(model, x2, work / "dynamic.onnx")
        times["export_dynamic_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        onnx_utils.make_session(work / "raw.onnx", level="all", threads=int(spec["threads"]),
                                optimized_model_path=work / "optimized.onnx")
        times["optimize_onnx_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        options = onnx_utils.session_options(level="all", threads=int(spec["threads"]),
                                             optimized_model_path=work / "optimized.ort")
        options.add_session_config_entry("session.save_model_format", "ORT")
        ort.InferenceSession(str(work / "raw.onnx"), options, providers=["CPUExecutionProvider"])
        times["optimize_ort_s"] = time.perf_counter() - t0
    return times


def _answer(spec: dict) -> dict:
    return _child_build(spec) if spec.get("role") == "build" else _child_load(spec)


if __name__ == "__main__":
    from graphbook.measure.compiletime import answer_as_child

    sys.exit(answer_as_child(sys.argv[1:], "graphbook.startup.restart_child", RESULT_MARKER, _answer))
