"""A minimal inference server for the ball detector: warm-up before readiness, dynamic batching (Chapter 7).

Introduced in Chapter 7. Standard library only (``http.server``). The article's serving rule: warm up
batch sizes 1, 2 and 3 at start-up, compiling when compilation is on, and report ready only after that,
so no request ever pays a compile. The model can be a PyTorch module (eager or ``torch.compile``) or a
deployment artifact loaded by :func:`load_artifact`: an AOTInductor ``.pt2`` package or an ONNX Runtime
model (``.onnx`` or ORT format ``.ort``); the ONNX Runtime path never imports torch.

Requests are queued and run by one worker thread. With batching on (the default), the worker joins
requests that wait together into one model call whose batch size is one of the warmed-up sizes, waiting
at most ``max_wait_ms`` for company after the oldest request arrived (Triton's dynamic batcher works the
same way). The queue is bounded: beyond ``max_queue`` waiting requests the server answers
``503`` with ``Retry-After`` at once, and a request that waited ``queue_timeout_s`` is answered 503
instead of waiting on.

HTTP interface
--------------
``GET /livez``
    ``200 {"status": "alive"}`` while the process serves HTTP (also during warm-up); ``500`` if the
    warm-up failed or a model call has run past ``inference_timeout_s`` (the process should be restarted).
``GET /readyz`` (and ``GET /healthz``, kept for compatibility)
    ``503 {"status": "warming_up", "warmed": [...]}`` until every batch size was warmed up, then
    ``200 {"status": "ready", "time_to_ready_s": ..., "warmup_s": {"1": ..}, "compiled": ..,
    "runtime": .., "batching": .., "queue": .., "calls_by_size": ..}``; ``503`` again while a model
    call hangs; ``500`` if the warm-up failed.
``POST /predict``
    The body is a batch of clips already in the model's input form, float32 ``(N, C, H, W)`` with
    ``C = 9`` (three ImageNet-normalised RGB frames, ``[f0 RGB, f1 RGB, f2 RGB]``), ``H, W`` the
    server's input size and ``N`` one of the warmed-up batch sizes. Two encodings:

    - ``Content-Type: application/octet-stream`` with headers ``X-Shape: N,C,H,W`` and
      ``X-Dtype: float32``; the body is the raw little-endian float32 bytes in C order
      (``array.astype('<f4').tobytes()``). Use this for full-size clips.
    - ``Content-Type: application/json`` with ``{"clips": <nested lists of numbers, shape (N,C,H,W)>}``
      (an optional ``"dtype": "float32"`` is accepted). Convenient for small inputs and debugging.

    ``200`` answer: ``{"batch_size": N, "joined_batch_size": M, "queue_ms": .., "inference_ms": ..,
    "detections": [[det_or_null per frame] per clip]}``, each detection ``{"x", "y", "score",
    "angle_deg", "half_length"}`` in pixels and degrees (decoded by
    :func:`graphbook.model.decoding.decode_batch`); ``M`` is the batch the model really ran (this request
    joined with others).

Errors are JSON ``{"error": "<message>"}`` and never stop the server: 400 malformed body, headers or
request line, 404 unknown path, 405 a method the path does not take (with ``Allow``), 408 a body that
stopped short of its Content-Length or did not arrive within ``request_timeout_s``, 411 no
Content-Length, 413 body larger than ``max_body_bytes`` (rejected from its Content-Length before it is
read, then the connection is closed: a client still pushing megabytes may see the connection reset
instead of the answer), 415 unsupported Content-Type or dtype, 422 well-formed but unusable input
(wrong shape, a batch size that was not warmed up, non-numeric or non-finite values), 500 a failure
inside the model, 501 a method HTTP does not define, 503 not ready yet, overloaded (the queue full
of whole requests, ``max_uploads`` bodies arriving, or every connection taken; refused from the
headers, before the body is read: a body still arriving holds no place in the queue) or the model
hangs (with ``Retry-After``), 504 the model call ran past ``inference_timeout_s``. A model call that hangs also
turns ``/livez`` to 500, so an orchestrator restarts the process.

Modules: :mod:`.runners` (the model behind one call, :func:`load_artifact`), :mod:`.batcher` (the
queue and the batching worker, :class:`InferenceService`), :mod:`.http` (request decoding, the
handler, :class:`InferenceServer`), :mod:`.loadtest` (clients and the bounded load test)
and :mod:`.litserve_compare` (the same ONNX Runtime session behind LitServe, for the comparison).
"""
# Exactly what the chapters and the scripts call; tests and other modules import the submodules.
from graphbook.serving.batcher import InferenceService
from graphbook.serving.http import InferenceServer
from graphbook.serving.loadtest import binary_request, load_test, predict, request
from graphbook.serving.runners import load_artifact

__all__ = ["InferenceServer", "InferenceService", "binary_request", "load_artifact", "load_test", "predict",
           "request"]
