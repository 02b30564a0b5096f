"""graphbook: the helper package every chapter of "Graph Compilers and Runtimes" imports.

Organised by concern, one module each (d2l style: every helper's docstring names the chapter
that introduces it):

- ``environment``  -- threads and the environment fingerprint every measurement carries (Chapter 1)
- ``timing``       -- the timing harness: warm-up, median, spread, CPU and CUDA (Chapter 1)
- ``results``      -- append-only CSV records in ``data/results/`` (Chapter 2)
- ``probes``       -- the physical limits: copy bandwidth and matmul compute peak (Chapter 1)
- ``compiletime``  -- cold / warm torch.compile timing (Chapter 2)
- ``folding``      -- Conv2d + BatchNorm2d folding (Chapter 1)
- ``blurball``     -- the BlurBall ball detector, its loader and input normalisation (Chapter 5)
- ``fusion_rules`` -- TVM's operator classes and fusion grouping on FX graphs (Chapter 3)
- ``onnx_utils``   -- export, ONNX Runtime sessions, operator counts (Chapter 4)
- ``plots``        -- the book's plotting helpers
- ``book``         -- chapter set-up, repository paths, data files
"""
