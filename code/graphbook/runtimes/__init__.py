"""The runtimes beside PyTorch: ONNX Runtime's levels and sessions, OpenVINO, the browser, and the profiles of a
forward (PyTorch's and ONNX Runtime's)."""
