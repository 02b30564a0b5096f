"""The inference server (graphbook.serving, Chapter 7) on loopback with a tiny model at 16 x 24 pixels: readiness,
good requests, the bad ones Chapter 7 does not send live under nbval."""
import collections
import http.client
import json
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from graphbook import serving
from graphbook.config import BATCH_SIZES
from graphbook.measure import warmup
from graphbook.paths import REPO_ROOT
from graphbook.runtimes import onnx_utils
from graphbook.serving import batcher, runners

H, W = 16, 24


class FramesAsHeatmaps(nn.Module):
    """Logits = 20 * (channel 0, 3, 6) - 10: a bright patch in a frame's red channel is a detection there."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def forward(self, x):
        self.batches.append(int(x.shape[0]))
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


def test_binary_and_json_requests_find_the_drawn_ball(server):
    x = clip_with_ball(batch=2)
    status, payload = serving.predict(server.url, x)
    assert status == 200, payload
    assert payload["batch_size"] == 2
    assert [len(c) for c in payload["detections"]] == [3, 3]
    for clip in payload["detections"]:
        det, empty1, empty2 = clip
        assert (empty1, empty2) == (None, None)
        assert abs(det["x"] - 10) < 0.5 and abs(det["y"] - 5) < 0.5
    status, js = post(server, json.dumps({"clips": x.tolist()}).encode(), {"Content-Type": "application/json"})
    assert status == 200 and js["detections"] == payload["detections"], js


def bad_requests():
    """The bad requests Chapter 7's code cell 10 does not send (wrong shape, size, dtype, JSON, length, body)."""
    body, headers = serving.binary_request(clip_with_ball())
    js = {"Content-Type": "application/json"}
    return {
        "missing dtype": ((body, {k: v for k, v in headers.items() if k != "X-Dtype"}), 415, "float32"),
        "bad shape header": ((body, {**headers, "X-Shape": "one,9,16,24"}), 400, "X-Shape"),
        "missing shape header": ((body, {k: v for k, v in headers.items() if k != "X-Shape"}), 400, "X-Shape"),
        "ragged JSON": ((json.dumps({"clips": [[1.0, 2.0], [3.0]]}).encode(), js), 422, "rectangular"),
        "JSON booleans": ((json.dumps({"clips": [[True]]}).encode(), js), 422, "numbers"),
        "JSON without clips": ((b'{"frames": []}', js), 400, "clips"),
        "JSON wrong dtype": ((json.dumps({"clips": [], "dtype": "int8"}).encode(), js), 415, "float32"),
        "NaN values": (serving.binary_request(np.full((1, 9, H, W), np.nan, np.float32)), 422, "NaN"),
        "unsupported content type": ((body, {**headers, "Content-Type": "text/plain"}), 415, "Content-Type"),
    }


@pytest.mark.parametrize("case", list(bad_requests()))
def test_bad_input_gets_4xx_with_message_and_server_keeps_serving(server, case):
    (body, headers), want_status, want_text = bad_requests()[case]
    status, payload = post(server, body, headers)
    assert status == want_status, payload
    assert want_text in payload["error"]
    status, payload = serving.predict(server.url, clip_with_ball())
    assert status == 200


@pytest.mark.parametrize("kwargs", [{"input_hw": (0, 24)}, {"batch_sizes": ()}, {"threshold": 1.5}, {"max_queue": 0},
                                    {"max_wait_ms": -1}, {"queue_timeout_s": 0}, {"retry_after_s": 0}])
def test_service_refuses_a_bad_setting(kwargs):
    with pytest.raises(ValueError):
        serving.InferenceService(FramesAsHeatmaps(), **{"input_hw": (H, W), **kwargs})


def test_load_artifact_refuses_an_unknown_suffix_and_a_missing_file():
    with pytest.raises(ValueError, match="must end in"):
        serving.load_artifact(REPO_ROOT / "model.bin")
    with pytest.raises(FileNotFoundError):
        serving.load_artifact(REPO_ROOT / "no-such-model.onnx")


@pytest.mark.slow
def test_the_armed_runner_compiles_nothing_and_leaves_the_stance_alone(monkeypatch):
    # Chapter 7's code cell 14 serves a compiled model: its requests compile no graph after the warm-up
    stances = []
    monkeypatch.setattr(torch.compiler, "set_stance", lambda *a, **k: stances.append(a))
    torch._dynamo.reset()
    runner = runners.TorchRunner(warmup.tiny_clip_net(hidden=4), compile=True)
    before = warmup.graphs_compiled()
    runner.arm()  # nothing was compiled before: the armed runner runs eagerly rather than compile
    assert runner(np.zeros((1, 9, 8, 12), np.float32)).shape == (1, 3, 8, 12)
    assert warmup.graphs_compiled() == before and stances == [], "the worker compiled or changed torch's stance"


def test_while_warming_up_readyz_says_when_to_retry_and_a_failed_warm_up_makes_livez_and_readyz_500():
    service = serving.InferenceService(FramesAsHeatmaps(), (H, W))
    srv = serving.InferenceServer(service).start(warm_up=False)
    try:
        status, payload = serving.predict(srv.url, clip_with_ball())
        assert status == 503 and "warming up" in payload["error"]
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert (response.status, response.getheader("Retry-After")) == (503, "1")
        assert json.loads(response.read())["warmed"] == []
        conn.close()
        service.warm_up()
        assert serving.request(srv.url + "/healthz")[1]["batching"] is True
    finally:
        srv.stop()
    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("weights are corrupt")

    service = serving.InferenceService(Broken(), (H, W))
    srv = serving.InferenceServer(service).start()
    try:
        with pytest.raises(RuntimeError, match="corrupt"):
            srv.wait_until_ready(timeout=30)
        for path in ("/livez", "/readyz"):
            status, payload = serving.request(srv.url + path)
            assert status == 500 and "corrupt" in payload["error"]
    finally:
        srv.stop()


@pytest.mark.parametrize("sizes, allowed, batching, expected", [
    ([1, 1, 1], (1, 2, 3), True, 3), ([1, 1, 1, 1], (1, 2, 3), True, 3), ([2, 2], (1, 2, 3), True, 1),
    ([1, 2], (1, 2, 3), True, 2), ([3, 1], (1, 2, 3), True, 1), ([1, 1], (1, 3), True, 1),
    ([1, 1, 1], (1, 3), True, 3), ([1, 1, 1], (1, 2, 3), False, 1), ([], (1, 2, 3), True, 0),
])
def test_plan_batch_takes_a_fifo_prefix_of_a_warmed_size(sizes, allowed, batching, expected):
    assert batcher._plan_batch(sizes, allowed, batching=batching) == expected


@pytest.mark.parametrize("batching, expected_calls", [(True, [3]), (False, [1, 1, 1])])
def test_concurrent_requests_are_joined_into_one_warmed_batch(batching, expected_calls):
    model = FramesAsHeatmaps()
    service = serving.InferenceService(model, (H, W), batching=batching, max_wait_ms=0)
    service.warm_up()
    model.batches.clear()
    service.pause()  # requests queue up; nothing runs until resume: deterministic, not timing-based
    answers = {}
    threads = [threading.Thread(target=lambda c=c: answers.update({c: service.predict(clip_with_ball(col=c))}))
               for c in (4, 10, 16)]
    try:
        for t in threads:
            t.start()
        while service.queued() < 3:
            time.sleep(0.005)
        service.resume()
        for t in threads:
            t.join(timeout=30)
        assert model.batches == expected_calls
        assert service.calls_by_size == collections.Counter(expected_calls)
        for col, answer in answers.items():  # each request gets its own clip's answer back
            assert answer["batch_size"] == 1 and answer["joined_batch_size"] == expected_calls[0]
            assert abs(answer["detections"][0][0]["x"] - col) < 0.5
    finally:
        service.close()


def test_load_test_is_loopback_only_and_bounded(server):
    x = clip_with_ball()
    for url, kwargs in (("http://example.com:80", {}), (server.url, {"requests": 0}),
                        (server.url, {"requests": 10 ** 6}), (server.url, {"time_limit_s": 3600})):
        with pytest.raises(ValueError):
            serving.load_test(url, x, **{"concurrency": 1, "requests": 2, **kwargs})
    report = serving.load_test(server.url, x, concurrency=2, requests=6, time_limit_s=60)
    assert (report["sent"], report["ok"], report["overloaded"], report["errors"]) == (6, 6, 0, 0)
    assert report["throughput_rps"] > 0 and report["p50_ms"] <= report["p99_ms"]
    # the model's own time per clip, for every batch size the worker ran
    sizes = [int(k.rsplit("_b", 1)[1]) for k in report if k.startswith("model_ms_per_clip_b")]
    assert sizes and all(1 <= n <= 3 for n in sizes) and all(report[f"model_ms_per_clip_b{n}"] >= 0 for n in sizes)


@pytest.mark.slow
def test_a_static_batch_artifact_serves_only_batch_1(tmp_path):
    static = onnx_utils.export_onnx(warmup.tiny_clip_net(hidden=4), torch.randn(1, 9, H, W), tmp_path / "static.onnx")
    runner = serving.load_artifact(static, threads=1)
    assert runner.static_batch() == 1
    with pytest.raises(ValueError, match="static batch of 1"):
        serving.InferenceService(runner, (H, W), batch_sizes=BATCH_SIZES)
    serving.InferenceService(runner, (H, W), batch_sizes=(1,)).warm_up()


@pytest.mark.slow
def test_server_starts_from_an_aoti_package(tmp_path):
    model = warmup.tiny_clip_net(hidden=4)
    batch = torch.export.Dim("batch", min=1, max=3)
    program = torch.export.export(model, (torch.randn(2, 9, H, W),), dynamic_shapes=({0: batch},))
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "tiny.pt2"),  # a smaller
                                                    inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"})
    runner = serving.load_artifact(path)
    service = serving.InferenceService(runner, (H, W))
    service.warm_up()
    x = np.random.default_rng(0).standard_normal((3, 9, H, W)).astype(np.float32)
    with torch.no_grad():
        assert np.abs(runner(x) - model(torch.from_numpy(x)).numpy()).max() < 1e-4
    assert service.predict(x[:2])["batch_size"] == 2
    service.close()


@pytest.mark.slow
def test_cli_serves_an_onnx_artifact_without_importing_torch(tmp_path):
    onnx = onnx_utils.export_dynamic_batch(warmup.tiny_clip_net(hidden=4), torch.randn(2, 9, H, W), tmp_path / "t.onnx")
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "code" / "serve_blurball.py"), "--artifact", str(onnx),
                             "--port", "0", "--height", str(H), "--width", str(W), "--threads", "1"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"on (http://\S+);", proc.stdout.readline()).group(1)
        assert proc.stdout.readline().startswith("READY")
        status, ready = serving.request(url + "/readyz")
        assert status == 200 and ready["runtime"] == "onnxruntime" and ready["torch_imported"] is False
        assert serving.predict(url, clip_with_ball(batch=3))[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("option", ["--load-artifacts", "--artifact", "--weights"])
def test_cli_a_corrupt_input_file_is_one_line_and_exit_2(tmp_path, option, script, capsys):
    corrupt = tmp_path / {"--load-artifacts": "cache.bin", "--artifact": "model.onnx", "--weights": "w.pt"}[option]
    corrupt.write_bytes(b"\x80\x04not what it claims to be" * 10)
    extra = {"--load-artifacts": ["--compile", "--model", "tiny"], "--artifact": [], "--weights": []}[option]
    threads = str(torch.get_num_threads())  # the script sets this process's threads: leave them as they are
    assert script("serve_blurball.py").main([option, str(corrupt), *extra, "--height", str(H), "--width", str(W),
                                             "--port", "0", "--threads", threads]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("serve_blurball.py: error:") and corrupt.name in err
