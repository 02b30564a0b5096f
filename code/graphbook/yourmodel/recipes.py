"""The few lines that build a variant outside the book (Chapter 8): what a reader pastes into their own code once the
command has named the fastest correct path. Code, not prose: each is run by the tests."""
from __future__ import annotations

from graphbook.method import variants

_HEAD = """import torch
from {module} import {factory}

torch.set_num_threads({threads})
model = {factory}().eval()
example = {example}
"""

_EAGER = {"eager_fp32": "run = model\n",
          "eager_fp32_channels_last": ("model = model.to(memory_format=torch.channels_last)\n"
                                       "def run(x):\n    return model(x.contiguous(memory_format=torch.channels_last))\n"),
          "eager_bf16_autocast": ("def run(x):\n    with torch.autocast(\"cpu\", dtype=torch.bfloat16):\n"
                                  "        return model(x)\n")}

_COMPILE = """compiled = torch.compile(model{mode})
def run(x):
    with torch.no_grad(), torch._inductor.config.patch({options}){autocast}:
        return compiled(x)
run(example)   # the first call compiles: do it before serving
"""

_EXPORT = """torch.onnx.export(model, (example,), "model.onnx", dynamo=True)
"""

_INT8 = """import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

class Calibration(CalibrationDataReader):   # samples of your own data, never the ones you check with
    def __init__(self):
        samples, name = torch.load("{inputs}", weights_only=True)[:{calibration}], onnx.load("model.onnx").graph.input[0].name
        self.feeds = iter({{name: samples[i:i + {batch}].numpy()}} for i in range(0, len(samples), {batch}))
    def get_next(self):
        return next(self.feeds, None)

quant_pre_process("model.onnx", "model_pre.onnx")
quantize_static("model_pre.onnx", "model_int8.onnx", Calibration(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, reduce_range={reduce_range})
"""

_ORT = """import onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = {threads}
options.graph_optimization_level = ort.GraphOptimizationLevel.{level}
session = ort.InferenceSession("{file}", options{disabled})
def run(x):
    return session.run(None, {{session.get_inputs()[0].name: x.numpy()}})
"""

_OPENVINO = """import openvino as ov
compiled = ov.Core().compile_model("{file}", "CPU", {{"INFERENCE_PRECISION_HINT": "{precision}",
                                   "INFERENCE_NUM_THREADS": {threads}, "PERFORMANCE_HINT": "LATENCY"}})
def run(x):
    return compiled(x.numpy())
"""

_ORT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
               "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}


def _compile_options(name: str) -> str:
    options = {"freezing": "freezing" in name}
    if "no_layout" in name:
        options["layout_optimization"] = False
    return ", ".join(f"{key}={value!r}" for key, value in options.items())


def example_code(inputs: str | None, batch: int, shape: tuple | None) -> str:
    """The recipe's example input: the first batch of the inputs file, or a random one of ``shape``."""
    if inputs is not None:
        return f'torch.load("{inputs}", weights_only=True)[:{batch}]   # any input of this shape'
    return f"torch.randn({', '.join(map(str, (batch, *shape)))})"


def recipe(name: str, *, factory: str, example: str, inputs: str | None, batch: int, calibration: int, threads: int,
           reduce_range: bool) -> str:
    """Python that builds variant ``name`` from the reader's factory ``MODULE:CALLABLE``; ``run(x)`` calls it.
    ``example`` is the code of an example input; the first ``calibration`` samples of ``inputs`` calibrate INT8,
    with ``reduce_range`` as this CPU needs it."""
    module, _, callable_name = factory.partition(":")
    code = _HEAD.format(module=module, factory=callable_name, threads=threads, example=example)
    variant = variants.get(name)
    if name in _EAGER:
        return code + _EAGER[name]
    if name == "eager_fp32_channels_last_folded":
        return code + ("from graphbook.method.folding import fold_all_conv_bn   # or fold each Conv2d/BatchNorm2d pair\n"
                       "model, _ = fold_all_conv_bn(model, (example,))\n" + _EAGER["eager_fp32_channels_last"])
    if variant.family == "compile":
        return code + _COMPILE.format(
            mode=', mode="max-autotune"' if "max_autotune" in name else "", options=_compile_options(name),
            autocast=', torch.autocast("cpu", dtype=torch.bfloat16)' if name.endswith("bf16") else "")
    int8 = variant.precision == "int8"
    code += _EXPORT + (_INT8.format(inputs=inputs, calibration=calibration, batch=batch, reduce_range=reduce_range)
                       if int8 else "")
    file = "model_int8.onnx" if int8 else "model.onnx"
    if variant.family == "onnxruntime":
        level = name.removeprefix("ort_") if name.removeprefix("ort_") in _ORT_LEVELS else "all"
        disabled = ', disabled_optimizers=["NchwcTransformer"]' if name == "ort_all_without_nchwc" else ""
        return code + _ORT.format(threads=threads, level=_ORT_LEVELS[level], disabled=disabled, file=file)
    return code + _OPENVINO.format(precision="bf16" if name == "openvino_bf16" else "f32", threads=threads, file=file)
