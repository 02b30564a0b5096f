"""The runtimes beside PyTorch: ONNX Runtime's levels and sessions, OpenVINO, the browser, and forward profiles."""
