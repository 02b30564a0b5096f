"""A minimal inference server for the ball detector: warm-up before readiness, dynamic batching (Chapter 7).
Its HTTP interface and error codes are documented in docs/serving.md."""
# Exactly what the chapters and the scripts call; tests and other modules import the submodules.
from graphbook.serving.batcher import InferenceService
from graphbook.serving.http import InferenceServer
from graphbook.serving.loadtest import binary_request, load_test, predict, request
from graphbook.serving.runners import load_artifact

__all__ = ["InferenceServer", "InferenceService", "binary_request", "load_artifact", "load_test", "predict",
           "request"]
