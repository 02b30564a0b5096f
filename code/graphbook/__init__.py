"""graphbook: the helper package every chapter of "Graph Compilers and Runtimes" imports.

Its folders are its layers (CONTRIBUTING.md has the map, one line per module, and the recipes for
adding a variant, a benchmark, a result kind or a figure):

- the modules at the top teach: each one is named for what a chapter teaches with it (``folding``,
  ``fusion_rules``, ``inductor_tools``, ``onnx_utils``, ``quantization``, ``restart_paths``...), and
  ``paths`` and ``book`` are the chapters' set-up;
- ``graphbook.record`` is the record of runs: the timing harness and its run protocol, the environment
  fingerprint, the result files, the decisions across recorded runs and the scripts' command line;
- ``graphbook.lab`` is the lab GPU library behind ``code/gpu_blurball.py`` and ``code/gpu_tensorrt.py``;
- ``graphbook.serving`` is the inference server of Chapter 7.

Installed editable from the repository root (``pip install -e .``, which scripts/setup_env.sh runs). What
a chapter calls names its chapter in its docstring; what only the package calls is private.
"""
