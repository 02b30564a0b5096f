"""The lab GPU library behind ``code/gpu_blurball.py`` and ``code/gpu_tensorrt.py`` (Chapters 4 and 5).

- ``gpu_measure``      -- the BlurBall GPU matrix: plan, check, time, profile
- ``gpu_profiling``    -- kernels by category, streams, first calls, max-autotune verdicts
- ``gpu_runtimes``     -- ONNX Runtime's CUDA and TensorRT providers, and which GPU runtimes this machine has
- ``tensorrt_engines`` -- TensorRT engine builds, runners and the symmetric INT8 model TensorRT accepts

Everything here runs on a CPU in the scripts' ``--smoke`` mode; CUDA, onnxruntime-gpu and TensorRT are
detected at run time and never required.
"""
