"""The runtimes that run BlurBall (ONNX Runtime, OpenVINO, INT8, the browser), the registry of every variant the
book times, and the check of a variant against eager."""
