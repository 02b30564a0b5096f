"""The inference server (graphbook.serving, Chapter 7): readiness, good requests, every kind of bad one.

The server runs on loopback with an ephemeral port and a tiny model at 16 x 24 pixels, so each test
takes milliseconds; one test compiles the tiny model to check the compiled warm-up path.
"""
import http.client
import json

import numpy as np
import pytest
import torch
from torch import nn

from graphbook import serving, warmup

H, W = 16, 24


class FramesAsHeatmaps(nn.Module):
    """Logits = 20 * (channel 0, 3, 6) - 10: a bright patch in a frame's red channel is a detection there."""

    def forward(self, x):
        return 20.0 * x[:, [0, 3, 6]] - 10.0


def clip_with_ball(batch=1, row=5, col=10):
    x = np.zeros((batch, 9, H, W), np.float32)
    x[:, 0, row - 1:row + 2, col - 1:col + 2] = 1.0  # frame 0 only
    return x


@pytest.fixture(scope="module")
def server():
    torch.set_num_threads(1)
    service = serving.InferenceService(FramesAsHeatmaps(), (H, W), max_body_bytes=200_000)
    srv = serving.InferenceServer(service).start()
    srv.wait_until_ready(timeout=60)
    yield srv
    srv.stop()


def post(srv, body, headers, path="/predict"):
    return serving.request(srv.url + path, "POST", body, headers)


def test_health_is_503_until_warm_up_then_200():
    service = serving.InferenceService(FramesAsHeatmaps(), (H, W))
    srv = serving.InferenceServer(service).start(warm_up=False)
    try:
        status, payload = serving.request(srv.url + "/healthz")
        assert (status, payload["status"]) == (503, "warming_up")
        status, payload = serving.predict(srv.url, clip_with_ball())
        assert status == 503 and "warming up" in payload["error"]
        service.warm_up()
        status, payload = serving.request(srv.url + "/healthz")
        assert status == 200 and payload["status"] == "ready"
        assert sorted(payload["warmup_s"]) == ["1", "2", "3"]
        assert payload["time_to_ready_s"] > 0
    finally:
        srv.stop()


def test_binary_request_finds_the_drawn_ball(server):
    status, payload = serving.predict(server.url, clip_with_ball(batch=2))
    assert status == 200, payload
    assert payload["batch_size"] == 2
    assert [len(c) for c in payload["detections"]] == [3, 3]
    for clip in payload["detections"]:
        det, empty1, empty2 = clip
        assert (empty1, empty2) == (None, None)
        assert abs(det["x"] - 10) < 0.5 and abs(det["y"] - 5) < 0.5


def test_json_request_gives_the_same_answer(server):
    x = clip_with_ball()
    status, payload = post(server, json.dumps({"clips": x.tolist()}).encode(), {"Content-Type": "application/json"})
    assert status == 200, payload
    _, binary = serving.predict(server.url, x)
    assert payload["detections"] == binary["detections"]


def bad_requests():
    good = clip_with_ball()
    body, headers = serving.binary_request(good)
    js = {"Content-Type": "application/json"}
    return {
        "wrong shape": (serving.binary_request(np.zeros((1, 9, 8, 8), np.float32)), 422, "shape"),
        "batch size not warmed up": (serving.binary_request(clip_with_ball(batch=4)), 422, "not warmed up"),
        "wrong dtype": ((good.astype(np.float64).tobytes(), {**headers, "X-Dtype": "float64"}), 415, "float32"),
        "missing dtype": ((body, {k: v for k, v in headers.items() if k != "X-Dtype"}), 415, "float32"),
        "bytes do not match shape": ((body[:-4], headers), 400, "bytes"),
        "bad shape header": ((body, {**headers, "X-Shape": "one,9,16,24"}), 400, "X-Shape"),
        "missing shape header": ((body, {k: v for k, v in headers.items() if k != "X-Shape"}), 400, "X-Shape"),
        "non-numeric JSON": ((json.dumps({"clips": [["a", "b"]]}).encode(), js), 422, "numbers"),
        "ragged JSON": ((json.dumps({"clips": [[1.0, 2.0], [3.0]]}).encode(), js), 422, "rectangular"),
        "JSON booleans": ((json.dumps({"clips": [[True]]}).encode(), js), 422, "numbers"),
        "malformed JSON": ((b'{"clips": [1, 2', js), 400, "valid JSON"),
        "JSON without clips": ((b'{"frames": []}', js), 400, "clips"),
        "JSON wrong dtype": ((json.dumps({"clips": [], "dtype": "int8"}).encode(), js), 415, "float32"),
        "NaN values": (serving.binary_request(np.full((1, 9, H, W), np.nan, np.float32)), 422, "NaN"),
        "unsupported content type": ((body, {**headers, "Content-Type": "text/plain"}), 415, "Content-Type"),
        "oversized body": ((b"0" * 250_000, js), 413, "exceeds"),
    }


@pytest.mark.parametrize("case", list(bad_requests()))
def test_bad_input_gets_4xx_with_message_and_server_keeps_serving(server, case):
    (body, headers), want_status, want_text = bad_requests()[case]
    status, payload = post(server, body, headers)
    assert status == want_status, payload
    assert want_text in payload["error"]
    status, payload = serving.predict(server.url, clip_with_ball())
    assert status == 200


def test_missing_content_length_and_unknown_path(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/predict")
    conn.putheader("Content-Type", "application/json")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()
    assert serving.request(server.url + "/nowhere")[0] == 404
    assert post(server, b"{}", {"Content-Type": "application/json"}, path="/elsewhere")[0] == 404
    assert serving.request(server.url + "/healthz")[0] == 200


def test_lying_content_length_is_refused_before_reading(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/predict")
    conn.putheader("Content-Type", "application/octet-stream")
    conn.putheader("Content-Length", str(10 ** 12))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()


def test_service_rejects_bad_configuration():
    with pytest.raises(ValueError):
        serving.InferenceService(FramesAsHeatmaps(), (0, 24))
    with pytest.raises(ValueError):
        serving.InferenceService(FramesAsHeatmaps(), (H, W), batch_sizes=())
    with pytest.raises(ValueError):
        serving.InferenceService(FramesAsHeatmaps(), (H, W), threshold=1.5)


def test_parse_shape_header():
    assert serving.parse_shape_header("1,9,16,24") == (1, 9, 16, 24)
    for bad in ("", "1,,2", "1,-9"):
        with pytest.raises(serving.RequestError):
            serving.parse_shape_header(bad)


def test_compiled_server_warms_up_every_batch_size_and_never_recompiles():
    torch._dynamo.reset()
    # same model and size as tests/test_warmup.py, so a warm Inductor cache serves both
    small_h, small_w = 8, 12
    service = serving.InferenceService(warmup.tiny_clip_net(hidden=4), (small_h, small_w), compile=True)
    srv = serving.InferenceServer(service).start()
    try:
        seconds, health = serving.wait_for_ready(srv.url, timeout=300)
        assert health["compiled"] is True
        before = warmup.graphs_compiled()
        for batch in (3, 1, 2, 1, 3):
            status, payload = serving.predict(srv.url, np.random.rand(batch, 9, small_h, small_w).astype(np.float32))
            assert status == 200 and payload["batch_size"] == batch
        assert warmup.graphs_compiled() == before  # requests compiled nothing
    finally:
        srv.stop()


SCRIPT = serving.__file__.replace("graphbook/serving.py", "serve_blurball.py")


@pytest.mark.parametrize("args", [["--port", "70000"], ["--height", "7"], ["--batch-sizes", "1,x"],
                                  ["--weights", "/nonexistent.pt"], ["--save-artifacts", "a.bin"]])
def test_cli_bad_arguments_exit_2_with_one_line(args):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_cli_serves_the_tiny_model_until_terminated():
    import re
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, SCRIPT, "--model", "tiny", "--port", "0", "--height", "16",
                             "--width", "24", "--threads", "1"], stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"on (http://\S+);", proc.stdout.readline()).group(1)
        assert proc.stdout.readline().startswith("READY")
        assert serving.request(url + "/healthz")[0] == 200
        assert serving.predict(url, clip_with_ball())[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
