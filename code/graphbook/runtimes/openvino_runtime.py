"""OpenVINO as a CPU runtime beside ONNX Runtime: compile the book's ONNX file, run it, and say what it did."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from graphbook.config import THREADS

# torch (and the probes that use it) are imported where needed: a restart path on an ONNX file runs OpenVINO
# without torch (Chapter 6 times that).

#: Precision hints the book uses (OpenVINO's names for ``INFERENCE_PRECISION_HINT``).
PRECISIONS = ("f32", "bf16")
DEVICE = "CPU"


def available() -> tuple[bool, str]:
    """Whether OpenVINO can be imported here, and if not the reason (Chapter 4)."""
    try:
        import openvino  # noqa: F401
    except ImportError as error:
        return False, ("OpenVINO variants need the openvino package, which requirements.txt installs everywhere "
                       f"but on aarch64 Linux, where its wheels need a newer glibc than torch's ({error})")
    return True, ""


def version() -> str:
    """OpenVINO's version string, or ``"absent"`` (Chapter 4)."""
    ok, _ = available()
    if not ok:
        return "absent"
    import openvino

    return openvino.__version__.split("-")[0]


def _cpu_capabilities() -> list[str]:
    """What OpenVINO's CPU plugin says this processor can run (``OPTIMIZATION_CAPABILITIES``; Chapter 4)."""
    import openvino as ov

    return [str(c) for c in ov.Core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES")]


def bf16_native() -> tuple[bool, str]:
    """Whether OpenVINO runs bfloat16 natively on this CPU, and why (Chapter 4)."""
    ok, why = available()
    if not ok:
        return False, why
    if "BF16" not in _cpu_capabilities():
        return False, "OpenVINO's CPU plugin lists no BF16 capability on this CPU"
    from graphbook.measure import probes

    native, reason = probes.bf16_support()
    return native, f"OpenVINO's CPU plugin lists BF16 ({reason})" if native else reason


def compile_model(path: str | Path, *, precision: str = "f32", threads: int = THREADS, cache_dir: str | Path | None = None):
    """OpenVINO's compiled model for the ``.onnx`` at ``path`` on the CPU plugin (Chapter 4)."""
    import openvino as ov

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": int(threads),
              "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = str(cache_dir)
    core = ov.Core()
    # compile straight from the file: with CACHE_DIR set, OpenVINO then skips reading the ONNX graph on a hit
    return core.compile_model(str(path), DEVICE, config)


def run_compiled(compiled, array):
    """One forward of a compiled model on a NumPy array; the first output as a float32 array (Chapter 4)."""
    request = getattr(compiled, "_graphbook_request", None)
    if request is None:  # one request reused: what a latency-bound caller does
        request = compiled.create_infer_request()
        compiled._graphbook_request = request
    request.infer({0: np.ascontiguousarray(array, dtype=np.float32)})
    return np.array(request.get_output_tensor(0).data, dtype=np.float32, copy=True)


def runner(path: str | Path, *, precision: str = "f32", threads: int = THREADS):
    """``x -> output`` for the ``.onnx`` at ``path`` compiled by OpenVINO (Chapter 4): ``x`` one tensor or a tuple of
    them, the output a float tensor, or a list of them when the model has several."""
    import torch

    compiled = compile_model(path, precision=precision, threads=threads)
    request = compiled.create_infer_request()   # one request reused: what a latency-bound caller does

    def run(x):
        args = x if isinstance(x, tuple) else (x,)
        request.infer({i: np.ascontiguousarray(a.detach().cpu().numpy(), dtype=np.float32) for i, a in enumerate(args)})
        outputs = [torch.from_numpy(np.array(request.get_output_tensor(k).data, dtype=np.float32, copy=True))
                   for k in range(len(compiled.outputs))]
        return outputs[0] if len(outputs) == 1 else outputs
    run.compiled = compiled
    run.onnx_path = Path(path)
    return run


def _rt_value(info: Mapping, key: str, default: str = "") -> str:
    if key not in info:
        return default
    value = info[key]
    return str(value.astype(str) if hasattr(value, "astype") else value)


def _runtime_layers(compiled) -> list[dict]:
    """Every layer of OpenVINO's executed graph, in execution order (Chapter 4)."""
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer_type = _rt_value(info, "layerType", op.get_type_name())
        if layer_type in ("Input", "Output", "Const", "Parameter", "Result", "Constant"):
            continue
        original = [n for n in _rt_value(info, "originalLayersNames").split(",") if n]
        layers.append({"name": op.get_friendly_name(), "layer_type": layer_type, "fused": original,
                       "precision": _rt_value(info, "runtimePrecision"),
                       "output_precisions": _rt_value(info, "outputPrecisions"),
                       "primitive": _rt_value(info, "primitiveType")})
    return layers


def _onnx_op_types(onnx_path) -> dict[str, str]:
    """ONNX node name -> operator type, to name what OpenVINO folded into each executed layer."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    # OpenVINO names a layer that produces a graph output after that output, so outputs map too
    types = {out: node.op_type for node in graph.node for out in node.output}
    types.update({node.name: node.op_type for node in graph.node if node.name})
    return types


def _fusion_patterns(layers: list[dict], op_types: Mapping[str, str]) -> dict[str, int]:
    """"Convolution + BatchNormalization + Relu" -> how many executed layers hold those ONNX operators."""
    patterns: Counter = Counter()
    for layer in layers:
        if len(layer["fused"]) < 2:
            continue
        names = {name.split("/")[0] for name in layer["fused"]}
        kinds = {op_types[name] for name in names if name in op_types}
        if layer["layer_type"] == "Convolution":
            kinds.discard("Conv")
        patterns[" + ".join([layer["layer_type"], *sorted(kinds)])] += 1
    return dict(patterns.most_common())


def describe_runtime(compiled, onnx_path: str | Path | None = None) -> dict:
    """What OpenVINO did to the graph, counted (Chapter 4)."""
    layers = _runtime_layers(compiled)
    fused = [layer for layer in layers if len(layer["fused"]) > 1]
    by_type = dict(Counter(layer["layer_type"] for layer in layers).most_common())
    return {"layers": len(layers), "by_type": by_type,
            "by_precision": dict(Counter(layer["precision"] for layer in layers).most_common()),
            "fused_layers": len(fused), "fused_ops": sum(len(layer["fused"]) for layer in fused),
            "reorders": sum(layer["layer_type"] == "Reorder" for layer in layers),
            "precision_by_type": {kind: dict(Counter(layer["precision"] for layer in layers
                                                      if layer["layer_type"] == kind)) for kind in by_type},
            "largest_fusions": [(layer["layer_type"], layer["fused"])
                                for layer in sorted(fused, key=lambda layer: -len(layer["fused"]))[:5]],
            **({"fusion_patterns": _fusion_patterns(layers, _onnx_op_types(onnx_path))} if onnx_path else {})}
