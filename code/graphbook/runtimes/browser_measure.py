"""WebAssembly against native ONNX Runtime: the page script in headless Chromium, and the ratio (Chapter 4)."""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from graphbook.measure import timing
from graphbook.runtimes.browser_runtime import (ASSETS_DIR, SIZES, BrowserAssetsError, check_native, load_manifest,
                                                publish, widget_html)

HARNESS = """<!doctype html><html><head><meta charset="utf-8"><title>onnxruntime-web harness</title>
<link rel="icon" href="data:,"></head><body>
{panel}
<script type="module" src="widget.js"></script></body></html>
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    isolate = False

    def end_headers(self):
        if self.isolate:  # what makes a page cross-origin isolated, so that WASM threads are allowed
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(folder: str | Path, *, isolate: bool = False):
    """Serve ``folder`` on loopback (optionally cross-origin isolated); yields the base URL (Chapter 4)."""
    handler = functools.partial(type("Handler", (_Handler,), {"isolate": isolate}), directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def measure_in_chromium(*, sizes: Sequence[str] = tuple(SIZES), levels: Sequence[str] = ("all",),
                        threads: int = 1, runs: int = 3, warmup: int = 2, repeats: Mapping[str, int] | int = 5,
                        assets_dir: str | Path = ASSETS_DIR, workdir: str | Path, progress=print,
                        probes: Callable[[], Mapping] | None = None) -> list[dict]:
    """WASM in headless Chromium against native ONNX Runtime, same files, sizes and threads (Chapter 4)."""
    from playwright.sync_api import sync_playwright

    workdir = Path(workdir)
    publish(workdir, assets_dir, webgpu=False, widget=True)
    empty = pd.DataFrame(columns=["size", "level", "threads", "median_ms", "min_ms", "max_ms", "passed"])
    panel = widget_html(empty, machine="this machine", assets_url="./")
    (workdir / "index.html").write_text(HARNESS.format(panel=panel))
    manifest = load_manifest(assets_dir)
    chromium = next((c for c in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
                     if Path(c).exists()), None)
    if chromium is None:
        raise BrowserAssetsError("Chromium is not installed: run scripts/setup_browser.sh")
    cases = {f"{runtime}_{level}@{key}": (key, level, runtime) for key in sizes for level in levels
             for runtime in ("onnxruntime_web_wasm", "onnxruntime_native")}
    with serve(workdir, isolate=threads > 1) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"])
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(base + "index.html", wait_until="load")
        version = browser.version

        def measure(name: str, index: int) -> dict:
            key, level, runtime = cases[name]
            entry = manifest["sizes"][key]
            n = repeats[key] if isinstance(repeats, Mapping) else int(repeats)
            row = {"runtime": runtime, "variant": f"{runtime}_{level}", "size": key, "height": entry["height"],
                   "width": entry["width"], "level": level, "threads": threads, "warmup": warmup, "repeats": n,
                   "browser": f"Chromium {version}", "model_file": entry["model"], "model_sha256": entry["model_sha256"]}
            if runtime == "onnxruntime_native":
                check, timed = check_native(assets_dir, key, level=level, threads=threads, warmup=warmup, repeats=n)
                row.update({k: check[k] for k in ("max_abs_diff", "same_output", "same_peaks", "passed")})
            else:
                timed = page.evaluate("async (o) => (await import('./widget.js')).benchmark(o)", {
                    "size": key, "level": level, "threads": threads, "warmup": warmup, "repeats": n})
                if timed.get("error"):
                    raise BrowserAssetsError(f"the page failed at {key}: {timed['error']}")
                row.update({k: timed[k] for k in ("max_abs_diff", "same_output", "same_peaks", "passed")},
                           browser_threads=timed["threads"])
            row.update({k: timed.get(k, float("nan")) for k in ("median_ms", "min_ms", "max_ms")},
                       times_ms=tuple(timed.get("times_ms", ())))
            progress(f"run {index + 1} {key} {level} {runtime}: {row['median_ms']:.1f} ms, "
                     f"check {'passed' if row['passed'] else 'FAILED'}")
            return row

        rows = timing.repeated_runs(list(cases), lambda order, index: {n: measure(n, index) for n in order},
                                    runs=runs, probe=probes)
        browser.close()
    if errors:
        raise BrowserAssetsError(f"the page raised: {errors[0]}")
    return rows


def ratio_table(frame):
    """WASM / native median per (CPU, size, level, threads) across recorded runs, with the spread (Chapter 4)."""
    keys = [c for c in ("cpu_model", "cpu_family", "cpu_model_id", "source_file", "run", "size", "level",
                        "threads") if c in frame.columns]
    passed = frame[frame["passed"].astype(bool)]
    wide = passed.pivot_table(index=keys, columns="runtime", values="median_ms", aggfunc="first").dropna()
    if wide.empty:
        return pd.DataFrame(columns=["size", "level", "threads", "ratio", "ratio_min", "ratio_max", "runs"])
    wide["ratio"] = wide["onnxruntime_web_wasm"] / wide["onnxruntime_native"]
    group = [k for k in keys if k != "run"]
    out = wide.reset_index().groupby(group).agg(
        ratio=("ratio", "median"), ratio_min=("ratio", "min"), ratio_max=("ratio", "max"), runs=("ratio", "size"),
        wasm_ms=("onnxruntime_web_wasm", "median"), native_ms=("onnxruntime_native", "median")).reset_index()
    return out
