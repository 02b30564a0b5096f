"""graphbook: the helper package every chapter of "Graph Compilers and Runtimes" imports.

Organised by concern, one module each (d2l style: every helper's docstring names the chapter
that introduces it). Installed editable from the repository root (``pip install -e .``, which
scripts/setup_env.sh runs). CONTRIBUTING.md has the same list as a table; tests/test_packaging.py
checks that both name every module:

- ``environment``  -- threads and the environment fingerprint every measurement carries (Chapter 1)
- ``timing``       -- the timing harness: warm-up, median, spread, CPU and CUDA (Chapter 1)
- ``runs``         -- decisions across recorded runs: medians per machine, load flags, the best
                      correct variant, comparisons phrased from the data (Chapter 5)
- ``results``      -- the results schema: file kinds, write_run/load/latest_run, column names, the one
                      tolerance and comparison with eager (Chapter 2)
- ``variants``     -- the registry of BlurBall variants and the one way to turn freezing on (Chapter 5)
- ``probes``       -- the physical limits: copy bandwidth, matmul compute peak, native bf16 (Chapter 1)
- ``profiling``    -- the CPU profile of one forward grouped the article's way; GFLOP/s vs peak (Chapter 5)
- ``gpu_profiling`` -- GPU kernels, streams, first calls and max-autotune verdicts for the lab scripts (Chapter 5)
- ``gpu_measure``  -- the BlurBall GPU matrix behind code/gpu_blurball.py: plan, check, time, profile (Chapter 5)
- ``gpu_runtimes`` -- ONNX Runtime's GPU providers and TensorRT engines behind code/gpu_tensorrt.py (Chapter 4)
- ``compiletime``  -- cold / warm torch.compile timing (Chapter 2)
- ``fusion_demo``  -- the article's CPU fusion demo behind code/03_fusion.py: chain variants, bytes-moved
                      model, measurements, report (Chapter 2)
- ``folding``      -- Conv2d + BatchNorm2d folding (Chapter 1)
- ``blurball``     -- the BlurBall ball detector, its loader and input normalisation (Chapter 5)
- ``fusion_rules`` -- TVM's operator classes and fusion grouping on FX graphs (Chapter 3)
- ``tvm_compare``  -- real TVM (optional, requirements-tvm.txt) as the referee of the fusion rules (Chapter 3)
- ``onnx_utils``   -- export, ONNX Runtime sessions, operator counts (Chapter 4)
- ``int8_matrix``  -- the matrix of ONNX Runtime static INT8 quantization choices (Chapter 4)
- ``inductor_tools`` -- generated code, kernel counts, graph-break summaries, ablation settings (Chapter 3)
- ``diagnostics``  -- the compiler's own diagnostics: TORCH_LOGS, tlparse, a graph break found and fixed (Chapter 3)
- ``miscompile``   -- the freezing miscompile taken apart: per-torch verdict, the two wrappers, the
                      dropped summand (Chapter 3)
- ``synthetic_clips`` -- synthetic ground-truth clips of a blurred ball and their targets (Chapter 5)
- ``decoding``     -- the heatmap decoder: logits back to ball position, angle, length (Chapter 5)
- ``scoring``      -- detections against ground truth: detection rate, position error (Chapter 5)
- ``training``     -- training BlurBall on synthetic clips behind code/train_blurball.py (Chapter 5)
- ``compile_cache`` -- compile time in fresh processes: cold, warm cache, saved artifacts (Chapter 6)
- ``restart_paths`` -- restart paths side by side: time to a fresh process's first correct output (Chapter 6)
- ``warmup``       -- recompilation counting and the warm-up for batch sizes 1, 2, 3 (Chapter 6)
- ``correctness``  -- every variant against eager FP32 and the ground truth (Chapter 6)
- ``serving``      -- the inference server: ready after warm-up, from a model or an artifact, dynamic batching (Chapter 7);
                      a subpackage:
  - ``serving.runners``  -- the model behind one call, load_artifact (Chapter 7)
  - ``serving.batcher``  -- warm-up, admission, the bounded queue and the batching worker (Chapter 7)
  - ``serving.http``     -- request decoding, the handler, InferenceServer and its limits on clients (Chapter 7)
  - ``serving.loadtest`` -- clients and the bounded loopback load test (Chapter 7)
  - ``serving.litserve_compare`` -- the same ONNX Runtime session behind LitServe (Chapter 7)
- ``provenance``   -- where and when each chapter last executed (appendix)
- ``plots``        -- the book's plotting helpers
- ``book``         -- chapter set-up, repository paths, data files
- ``cli``          -- the scripts' one parser, --results-dir, argument types, the exit-status policy (Chapter 2)
"""
