"""TensorRT engines for the lab GPU run (Chapter 4): strongly typed builds with and without a timing cache,
a runner on a dedicated CUDA stream, and the symmetric INT8 Q/DQ model TensorRT accepts."""
from __future__ import annotations

import time
from pathlib import Path

import onnx
import torch
from onnx import numpy_helper
from onnxruntime import quantization as quant

from graphbook.lab import gpu_profiling as gp
from graphbook.int8 import quantization


class EngineBuild:
    """One TensorRT build (Chapter 4): engine, build seconds, typing mode, plan size, timing cache after the build."""

    def __init__(self, engine, build_s: float, typing: str, plan_bytes: int, timing_cache: bytes,
                 with_timing_cache: bool, keep_alive=()):
        self.engine, self.build_s, self.typing, self.plan_bytes = engine, build_s, typing, plan_bytes
        self.timing_cache, self.with_timing_cache = timing_cache, with_timing_cache
        self.keep_alive = tuple(keep_alive)  # the runtime and logger outlive the engine they made


def build_tensorrt_engine(trt, onnx_path: Path, workspace_mib: int, *, timing_cache: bytes | None = None,
                          int8: bool = False) -> EngineBuild:
    """Parse an ONNX file and build a deserialised engine (Chapter 4)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    strong = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # absent in old versions
    typing_mode = "weak (builder flags)" if strong is None else "strong"
    network = builder.create_network(0 if strong is None else 1 << int(strong))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # reads the external weights beside the file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {Path(onnx_path).name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if typing_mode != "strong":  # removed in TensorRT 11; only reached on old versions
        config.set_flag(trt.BuilderFlag.INT8 if int8 else trt.BuilderFlag.FP16)
    cache = config.create_timing_cache(bytes(timing_cache or b""))
    config.set_timing_cache(cache, False)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    build_s = time.perf_counter() - start
    if plan is None:
        raise RuntimeError("TensorRT returned no engine (see its log above)")
    serialized = bytes(config.get_timing_cache().serialize())
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeError("TensorRT could not deserialize the engine it just built")
    return EngineBuild(engine, build_s, typing_mode, int(plan.nbytes), serialized, timing_cache is not None,
                       keep_alive=(runtime, logger))


def tensorrt_runner(trt, engine, x, stream, *, device: str = "cuda"):
    """A zero-argument function that enqueues the engine on ``stream`` and returns its output (Chapter 4)."""
    handle = gp.stream_handle(stream)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    if len(inputs) != 1 or len(outputs) != 1:
        raise RuntimeError(f"expected one input and one output, got {inputs} and {outputs}")
    dtypes = {trt.DataType.HALF: torch.float16, trt.DataType.FLOAT: torch.float32}
    x = x.to(dtypes[engine.get_tensor_dtype(inputs[0])]).contiguous()
    output = torch.empty(tuple(engine.get_tensor_shape(outputs[0])),
                         dtype=dtypes[engine.get_tensor_dtype(outputs[0])], device=device)
    context = engine.create_execution_context()
    if context is None:
        raise RuntimeError("TensorRT could not create an execution context")
    context.set_tensor_address(inputs[0], x.data_ptr())
    context.set_tensor_address(outputs[0], output.data_ptr())
    bound = (engine, x, output)  # TensorRT holds raw pointers: keep the tensors (and engine) alive

    def run():
        ok = context.execute_async_v3(handle)
        if ok is False or ok is None:
            raise RuntimeError(f"TensorRT engine: execute_async_v3 returned {ok!r}: the enqueue failed, so there is "
                               "no output to time (see TensorRT's log above)")
        return bound[2]
    return run


def tensorrt_qdq_problem(model_path: Path) -> str | None:
    """Why TensorRT cannot build this Q/DQ model, or None (Chapter 4)."""
    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {t.name: t for t in model.graph.initializer}
    constants = {o: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant" for o in n.output
                 if n.attribute and n.attribute[0].name == "value"}
    uint8, nonzero, nodes = 0, 0, 0
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        nodes += 1
        if len(node.input) < 3 or not node.input[2]:
            uint8 += 1  # no zero point: ONNX's default is a uint8 zero
            continue
        tensor = initializers.get(node.input[2]) or constants.get(node.input[2])
        if tensor is None:
            continue
        if tensor.data_type == onnx.TensorProto.UINT8:
            uint8 += 1
        if numpy_helper.to_array(tensor).any():
            nonzero += 1
    if nodes == 0:
        return "the model has no QuantizeLinear/DequantizeLinear nodes"
    if uint8 or nonzero:
        return (f"TensorRT takes only symmetric INT8 Q/DQ (int8 zero point 0); this model has {uint8} "
                f"uint8 and {nonzero} non-zero zero points of {nodes} Q/DQ nodes (asymmetric uint8 activations)")
    return None


def quantize_symmetric(fp32_path: Path, out_path: Path, frames) -> Path:
    """Chapter 4's static Q/DQ recipe as TensorRT takes it: int8 activations and weights, symmetric (zero points 0)."""
    input_name = onnx.load(str(fp32_path), load_external_data=False).graph.input[0].name
    with quantization.quiet_onnxruntime():
        quant.quantize_static(str(fp32_path), str(out_path), quantization.calibration_reader(input_name, frames),
                              quant_format=quant.QuantFormat.QDQ, activation_type=quant.QuantType.QInt8,
                              weight_type=quant.QuantType.QInt8, per_channel=True,
                              calibrate_method=quant.CalibrationMethod.MinMax,
                              extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return out_path
