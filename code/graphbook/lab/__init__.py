"""The lab GPU library behind ``code/gpu_blurball.py`` and ``code/gpu_tensorrt.py`` (Chapters 4 and 5)."""
