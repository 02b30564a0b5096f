"""The server under hostile clients (graphbook.serving, Chapter 7): each fault bounded, every answer JSON. A stalled
client must be dropped within a generous multiple of the server's own timeout, never an absolute number."""
import http.client
import json
import select
import socket
import threading
import time

import numpy as np
import torch
from torch import nn

from graphbook import serving

H, W = 16, 24
TIMEOUT_S = 1.0          # the server's request_timeout_s in these tests
BOUND_S = 20 * TIMEOUT_S  # "dropped in bounded time": a generous multiple of it, for a loaded 2-core machine


class HangableHeatmaps(nn.Module):
    """Logits = 20 * (channel 0, 3, 6) - 10; while ``hang`` is set, a call blocks until ``release``."""

    def __init__(self):
        super().__init__()
        self.hang, self.release = threading.Event(), threading.Event()
        self.batches = []

    def forward(self, x):
        self.batches.append(int(x.shape[0]))
        if self.hang.is_set():
            self.release.wait(60)
        return 20.0 * x[:, [0, 3, 6]] - 10.0


def clip(batch=1):
    x = np.zeros((batch, 9, H, W), np.float32)
    x[:, 0, 4:7, 9:12] = 1.0
    return x


def make_server(model=None, *, max_connections=32):
    torch.set_num_threads(1)
    service = serving.InferenceService(model or HangableHeatmaps(), (H, W), max_body_bytes=200_000, max_queue=4,
                                       queue_timeout_s=2.0, inference_timeout_s=0.5)
    srv = serving.InferenceServer(service, request_timeout_s=TIMEOUT_S, max_connections=max_connections).start()
    srv.wait_until_ready(timeout=60)
    return srv


def connect(srv, timeout=BOUND_S):
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


def read_answer(sock):
    """(status, headers, JSON payload) of the next response on ``sock``; (None, {}, None) on EOF or reset."""
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        raw = response.read()
    except (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionError):
        return None, {}, None
    headers = {k.lower(): v for k, v in response.getheaders()}
    assert headers.get("content-type") == "application/json", (response.status, raw[:200])
    return response.status, headers, json.loads(raw)


def exchange(srv, raw: bytes):
    sock = connect(srv)
    try:
        sock.sendall(raw)
        return read_answer(sock)
    finally:
        sock.close()


def predict_head(length):
    return (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nX-Dtype: float32\r\n"
            f"X-Shape: 1,9,{H},{W}\r\nContent-Length: {length}\r\n\r\n").encode()


def good_request(srv):
    return serving.predict(srv.url, clip())


def probe_until(srv, stop, seen):
    """Poll /livez and /readyz until ``stop`` is set; record every (status, seconds)."""
    while not stop.wait(0.02):
        for path in ("/livez", "/readyz"):
            t0 = time.perf_counter()
            seen.append((serving.request(srv.url + path, timeout=BOUND_S)[0], time.perf_counter() - t0))


def test_hostile_clients_get_json_answers_in_bounded_time_and_probes_stay_prompt(capfd):
    model = HangableHeatmaps()
    srv = make_server(model)
    stop_probing, probes = threading.Event(), []
    prober = threading.Thread(target=probe_until, args=(srv, stop_probing, probes), daemon=True)
    prober.start()
    try:
        # 1. a stalled body: 10 of 1000 bytes, then silence -> 408 once the request's deadline passes
        stalled = connect(srv)
        stalled.sendall(predict_head(1000) + b"x" * 10)
        # 2. a slow-loris: headers dribbled one line at a time, never finished -> cut off
        loris = connect(srv)
        loris.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
        dribbles = []
        dribbler = threading.Thread(target=_dribble_headers, args=(loris, dribbles))
        dribbler.start()
        # 3. a client that disconnects mid-body
        quitter = connect(srv)
        quitter.sendall(predict_head(1000) + b"x" * 10)
        quitter.close()
        # 4. malformed and missing Content-Length; a request line without a version; wrong methods and paths
        cases = {
            "Content-Length beyond any int": (predict_head("9" * 5000), 413, None),
            "Content-Length in exponent form": (predict_head("1e3"), 400, None),
            "missing Content-Length": (b"POST /predict HTTP/1.1\r\nHost: x\r\n\r\n", 411, None),
            "request line without a version": (b"GET\r\n\r\n", 400, None),
            "PUT on /predict": (b"PUT /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "POST"),
            "OPTIONS on /predict": (b"OPTIONS /predict HTTP/1.1\r\nHost: x\r\n\r\n", 405, "POST"),
            "GET on /predict": (b"GET /predict HTTP/1.1\r\nHost: x\r\n\r\n", 405, "POST"),
            "DELETE on /livez": (b"DELETE /livez HTTP/1.1\r\nHost: x\r\n\r\n", 405, "GET"),
            "POST on /readyz": (b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 405, "GET"),
            "PATCH on an unknown path": (b"PATCH /admin HTTP/1.1\r\nHost: x\r\n\r\n", 404, None),
            "GET on an unknown path": (b"GET /readyz/extra HTTP/1.1\r\nHost: x\r\n\r\n", 404, None),
        }
        for name, (raw, want, allow) in cases.items():
            status, headers, payload = exchange(srv, raw)
            assert status == want and payload.get("error"), (name, status, payload)
            assert headers.get("allow") == allow, name
        assert read_answer(stalled)[0] == 408
        stalled.close()
        dribbler.join(BOUND_S)
        # cut off by the request deadline, long before http.server's limit of 100 header lines
        assert dribbles and dribbles[-1] == "cut" and len(dribbles) < 50, dribbles[-3:]
        loris.close()
        stop_probing.set()
        prober.join(BOUND_S)
        assert probes and {s for s, _ in probes} == {200}, sorted({s for s, _ in probes})
        # prompt: no probe waited as long as a stalled client is allowed to hold a connection
        assert max(sec for _, sec in probes) < 10 * TIMEOUT_S

        # 5. a model that hangs: its request gets 504, /livez says hung (restart me), new work is refused
        model.hang.set()
        box = []
        hung_request = threading.Thread(target=lambda: box.append(good_request(srv)))
        hung_request.start()
        hung_request.join(BOUND_S)
        assert not hung_request.is_alive(), "a request on a hung model was never answered"
        assert box[0][0] == 504 and "did not answer" in box[0][1]["error"]
        assert serving.request(srv.url + "/livez")[0] == 500
        assert serving.request(srv.url + "/readyz")[0] == 503
        status, payload = good_request(srv)
        assert status == 503 and "not answering" in payload["error"]
        model.release.set()
        model.hang.clear()
        _wait_for(lambda: serving.request(srv.url + "/livez")[0] == 200)

        # afterwards a valid request is served, and nobody printed a traceback
        status, payload = good_request(srv)
        assert status == 200 and payload["batch_size"] == 1
        assert srv.dropped_connections >= 1
    finally:
        stop_probing.set()
        model.release.set()
        srv.stop()
    assert "Traceback" not in capfd.readouterr().err


def _dribble_headers(sock, log, every_s=0.1):
    """Send one header line every ``every_s`` (never the blank line) until the server answers or cuts."""
    for _ in range(int(BOUND_S / every_s)):
        if select.select([sock], [], [], 0)[0]:  # an answer or EOF: the server gave up on it
            break
        try:
            sock.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
        log.append("sent")
        time.sleep(every_s)
    else:
        return  # never cut off
    log.append("cut")


def _wait_for(condition, timeout=BOUND_S):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_connections_beyond_the_limit_get_503_the_held_ones_are_dropped_and_stop_before_start_returns():
    srv = make_server(max_connections=2)
    try:
        held = [connect(srv) for _ in range(2)]
        for sock in held:
            sock.sendall(b"GET /livez HTTP/1.1\r\n")  # a request line, then nothing
        _wait_for(lambda: srv.connections == 2)
        status, headers, payload = exchange(srv, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and "too many connections" in payload["error"]
        for sock in held:  # the server gives up on them: EOF (or a JSON answer), within the bound
            sock.settimeout(BOUND_S)
            assert sock.recv(65536) is not None
            sock.close()
        _wait_for(lambda: srv.connections == 0)
        assert good_request(srv)[0] == 200 and srv.refused_connections == 1
    finally:
        srv.stop()
    srv = serving.InferenceServer(serving.InferenceService(HangableHeatmaps(), (H, W)))
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    stopper.join(BOUND_S)
    assert not stopper.is_alive(), "InferenceServer.stop() before start() blocked"


def test_the_plan_never_counts_expired_requests_so_only_warmed_sizes_run():
    model = HangableHeatmaps()
    service = serving.InferenceService(model, (H, W), batch_sizes=(1, 3), queue_timeout_s=5.0, max_wait_ms=0)
    service.warm_up()
    model.batches.clear()
    service.pause()
    try:
        items = [service.submit(clip()) for _ in range(3)]
        items[1].enqueued -= 100.0  # the middle request has waited far beyond queue_timeout_s
        service.resume()
        for item in items:
            assert item.done.wait(BOUND_S)
        assert items[1].error is not None and items[1].error.status == 503 and "waited" in items[1].error.message
        assert set(model.batches) <= {1, 3}, f"ran batch sizes {model.batches}, warmed up only 1 and 3"
    finally:
        service.close()


def test_a_client_that_sends_its_whole_body_into_a_full_queue_reads_its_503():
    # 5.3 MB: more than the socket buffers hold, so a server that closed without reading would reset it
    big_h, big_w = 288, 512
    service = serving.InferenceService(HangableHeatmaps(), (big_h, big_w), max_queue=1)
    srv = serving.InferenceServer(service, request_timeout_s=30).start()
    srv.wait_until_ready(timeout=60)
    service.pause()
    try:
        x = np.zeros((1, 9, big_h, big_w), np.float32)
        waiting = threading.Thread(target=serving.predict, args=(srv.url, x))
        waiting.start()
        _wait_for(lambda: service.queued() == 1)
        body, headers = serving.binary_request(x)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=BOUND_S)
        try:
            for _ in range(2):  # and the connection stays usable for the next request
                conn.request("POST", "/predict", body, headers)
                response = conn.getresponse()
                assert response.status == 503 and "overloaded" in json.loads(response.read())["error"]
        finally:
            conn.close()
        service.resume()
        waiting.join(BOUND_S)
    finally:
        service.resume()
        srv.stop()
