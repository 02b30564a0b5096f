"""Chapter 4's in-browser model: its files, its check, and ``scripts/check_rendered_book.py`` clicking it on a
one-page site with a small stand-in model, which must fail the page when the model or its reference is wrong."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.measure import environment
from graphbook.record import results
from graphbook.runtimes import browser_measure, browser_runtime
from conftest import slow_fixture

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "scripts" / "check_rendered_book.py"
KEY = browser_runtime.DEFAULT_SIZE


def _stand_in():
    """BlurBall's shapes in a few tens of kilobytes; a call takes long enough for the stop button to find a run."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(9, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 3, 1)).eval()


@pytest.fixture(scope="module")
@slow_fixture
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("ortweb-assets")
    manifest = browser_runtime.export_browser_assets(out, [KEY], build_model=_stand_in)
    return out, manifest


@pytest.mark.slow
def test_manifest_names_the_files_the_tolerance_and_the_reader_columns(assets):
    out, manifest = assets
    entry = manifest["sizes"][KEY]
    assert manifest["atol"] == SAME_OUTPUT_ATOL
    assert manifest["columns"] == list(browser_runtime.READER_COLUMNS)
    assert entry["input_shape"] == [1, 9, 96, 160] and entry["output_shape"] == [1, 3, 96, 160]
    assert len(entry["peaks"]) == 3 and entry["model_bytes"] <= browser_runtime.MAX_MODEL_BYTES
    assert browser_runtime.check_assets(out) == manifest
    # exporting again with nothing changed rewrites nothing
    before = (out / entry["model"]).stat().st_mtime_ns
    browser_runtime.export_browser_assets(out, [KEY], build_model=_stand_in)
    assert (out / entry["model"]).stat().st_mtime_ns == before


def test_native_check_passes_on_the_file_fails_on_a_changed_reference_and_a_changed_file_is_refused(assets, tmp_path):
    out, manifest = assets
    entry = manifest["sizes"][KEY]
    clip = browser_runtime._read_tensor(out / entry["clip"], entry["input_shape"])
    from graphbook.runtimes import onnx_utils

    output = onnx_utils.run_session(onnx_utils.make_session(out / entry["model"], threads=1), clip)
    assert browser_runtime.compare(output, out, KEY)["passed"]
    assert not browser_runtime.compare(output + 0.01, out, KEY)["passed"]  # beyond the tolerance
    frame = browser_runtime.native_figures(out, sizes=[KEY], threads=1, warmup=1, repeats=3)
    assert list(frame["level"]) == list(browser_runtime.LEVELS) and frame["passed"].all()
    assert (frame["min_ms"] <= frame["median_ms"]).all() and (frame["median_ms"] <= frame["max_ms"]).all()
    out, manifest = assets
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / manifest["sizes"][KEY]["reference"]).write_bytes(b"\0" * 16)
    with pytest.raises(browser_runtime.BrowserAssetsError, match="setup_web.sh"):
        browser_runtime.check_assets(copy)
    with pytest.raises(browser_runtime.BrowserAssetsError, match="setup_web.sh"):
        browser_runtime.load_manifest(tmp_path / "nowhere")


def test_sizes_simd_width_and_the_widget_embeds_the_native_figures_and_marks_a_failed_check():
    assert browser_runtime._parse_sizes("288x512,96x160,96x160") == ("288x512", "96x160")
    with pytest.raises(ValueError, match="96x160"):
        browser_runtime._parse_sizes("100x100")
    assert browser_runtime._simd_width_bits({"avx512f": True, "avx2": True}) == 512
    assert browser_runtime._simd_width_bits({"avx512f": False, "avx2": True}) == 256
    laptop = environment.cpu_features(machine="x86_64", environ={environment.FEATURES_ENV: "avx2"})
    assert "256-bit" in browser_runtime.simd_sentence(laptop) and "2 times" in browser_runtime.simd_sentence(laptop)
    assert "cannot tell" in browser_runtime.simd_sentence({"isa": "unknown"})
    native = pd.DataFrame([{"size": KEY, "level": "all", "threads": 1, "median_ms": 36.0, "min_ms": 35.0,
                            "max_ms": 40.0, "passed": True},
                           {"size": KEY, "level": "disabled", "threads": 1, "median_ms": float("nan"),
                            "min_ms": float("nan"), "max_ms": float("nan"), "passed": False}])
    panel = browser_runtime.widget_html(native, machine="a test CPU")
    assert "data-ortweb-demo" in panel and 'disabled>Check, then time' in panel
    data = json.loads(panel.split('data-native="', 1)[1].split('"', 1)[0].replace("&quot;", '"'))
    assert data["machine"] == "a test CPU"
    assert data["figures"][KEY]["all"]["median_ms"] == 36.0 and data["figures"][KEY]["disabled"]["median_ms"] is None


def test_ratio_table_pairs_runs_and_leaves_out_failed_checks():
    rows = []
    for run, (web, native) in enumerate([(200.0, 40.0), (180.0, 40.0), (220.0, 40.0)], start=1):
        for runtime, ms in (("onnxruntime_web_wasm", web), ("onnxruntime_native", native)):
            rows.append({"run": run, "runtime": runtime, "size": KEY, "level": "all", "threads": 1,
                         "median_ms": ms, "passed": True, "cpu_model": "cpu"})
    rows.append({"run": 4, "runtime": "onnxruntime_web_wasm", "size": KEY, "level": "all", "threads": 1,
                 "median_ms": 1.0, "passed": False, "cpu_model": "cpu"})
    rows.append({"run": 4, "runtime": "onnxruntime_native", "size": KEY, "level": "all", "threads": 1,
                 "median_ms": 40.0, "passed": True, "cpu_model": "cpu"})
    table = browser_measure.ratio_table(pd.DataFrame(rows))
    assert len(table) == 1
    row = table.iloc[0]
    assert row["runs"] == 3 and row["ratio"] == pytest.approx(5.0)
    assert row["ratio_min"] == pytest.approx(4.5) and row["ratio_max"] == pytest.approx(5.5)


# -- The panel in Chromium, judged by the book's own browser check
def _site(html, assets_dir):
    """The panel on ``html``/index.html with its files under ``html``/_static/ortweb; returns that folder."""
    static = html / "_static" / "ortweb"
    browser_runtime.publish(static, assets_dir, webgpu=False, widget=True)
    native = pd.DataFrame(columns=["size", "level", "threads", "median_ms", "min_ms", "max_ms", "passed"])
    panel = browser_runtime.widget_html(native, machine="nowhere", assets_url="_static/ortweb/")
    (html / "index.html").write_text(
        '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>panel</title>'
        f'</head><body><main>{panel}</main><script type="module" src="_static/ortweb/widget.js"></script>'
        "</body></html>")
    return static


def _check(html, tmp_path):
    proc = subprocess.run([sys.executable, str(CHECKER), str(html), "--screenshots", str(tmp_path / "shots"),
                           "--notebooks-root", str(tmp_path)], capture_output=True, text=True, timeout=600)
    if proc.returncode == 2 and "Chromium is not installed" in proc.stderr:
        pytest.skip("needs Chromium (scripts/setup_browser.sh installs it; test.sh runs that first)")
    return proc


@pytest.fixture(scope="module")
def runtime_installed():
    try:
        browser_runtime.runtime_dir()
    except browser_runtime.BrowserAssetsError:
        pytest.skip("needs onnxruntime-web (scripts/setup_web.sh installs it; test.sh runs that first)")


@pytest.fixture(scope="module")
@slow_fixture
def checked_panels(assets, tmp_path_factory, runtime_installed):
    """Three copies of the panel checked in one browser session: intact, its model file missing, its stored
    reference changed. ``{folder: (FAIL or ok, the problems reported)}``."""
    root = tmp_path_factory.mktemp("panels")
    html = root / "html"
    statics = {name: _site(html / name, assets[0]) for name in ("intact", "missing", "mismatch")}
    (html / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
                                     "<title>book</title></head><body><main><p>Book.</p></main></body></html>")
    entry = assets[1]["sizes"][KEY]
    (statics["missing"] / entry["model"]).unlink()
    reference = browser_runtime._read_tensor(statics["mismatch"] / entry["reference"], entry["output_shape"])
    (statics["mismatch"] / entry["reference"]).write_bytes((reference + np.float32(0.01)).astype("<f4").tobytes())
    proc = _check(html, root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    pages, page = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith(("FAIL ", "ok   ")):
            page = line[5:].split(" (")[0].removesuffix("/index.html")
            pages[page] = (line[:4].strip(), "")
        elif line.startswith("       - ") and page is not None:
            pages[page] = (pages[page][0], pages[page][1] + " | " + line.strip())
    return pages


def test_browser_check_passes_intact_files_and_fails_a_missing_model_or_a_changed_reference(checked_panels):
    assert checked_panels["intact"][0] == "ok", checked_panels["intact"]
    verdict, problems = checked_panels["missing"]
    assert verdict == "FAIL" and "the in-browser check did not pass" in problems and "did not load" in problems
    assert "Check failed" in problems and "The model is not timed" in problems
    verdict, problems = checked_panels["mismatch"]
    assert verdict == "FAIL" and "the in-browser check did not pass" in problems
    assert "differs from the stored reference" in problems and "no time appeared" not in problems


def _open_panel(tmp_path, assets_dir):
    """A Playwright page on the one-page site, or a skip where Chromium is absent."""
    from playwright.sync_api import sync_playwright

    chromium = next((c for c in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
                     if Path(c).exists()), None)
    if chromium is None:
        pytest.skip("needs Chromium (scripts/setup_browser.sh installs it; test.sh runs that first)")
    html = tmp_path / "html"
    _site(html, assets_dir)
    return html, sync_playwright, chromium


@pytest.mark.slow
def test_download_is_one_row_of_the_reader_kind_and_stop_reports_no_time(assets, tmp_path, runtime_installed):
    html, sync_playwright, chromium = _open_panel(tmp_path, assets[0])
    with browser_measure.serve(html) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(accept_downloads=True)
        page.goto(base + "index.html")
        page.fill(".ortweb-repeats", "3")
        page.click(".ortweb-run")
        page.wait_for_function("document.querySelector('.ortweb-results').dataset.done === 'true'", timeout=120_000)
        with page.expect_download() as info:
            page.click(".ortweb-download")
        download = info.value
        target = tmp_path / download.suggested_filename
        download.save_as(target)
        # stop, pressed while the calls are being timed: no time is shown for the incomplete run
        page.fill(".ortweb-repeats", "200")
        page.click(".ortweb-run")
        page.wait_for_function("document.querySelector('.ortweb-status').textContent.startsWith('Timing')", timeout=60_000)
        page.click(".ortweb-stop")
        page.wait_for_function("document.querySelector('.ortweb-status').textContent.startsWith('Stopped')", timeout=60_000)
        stopped_rows = page.eval_on_selector_all(".ortweb-results tbody tr", "els => els.length")
        browser.close()
    assert results.kind("browser-reader").matches(target.name)
    row = pd.read_csv(target)
    assert list(row.columns) == list(browser_runtime.READER_COLUMNS) and len(row) == 1
    assert bool(row.loc[0, "same_output"]) and bool(row.loc[0, "same_peaks"]) and row.loc[0, "threads"] == 1
    assert row.loc[0, "height"] == 96 and row.loc[0, "model_sha256"] == assets[1]["sizes"][KEY]["model_sha256"]
    assert 0 < row.loc[0, "min_ms_all"] <= row.loc[0, "median_ms_all"] <= row.loc[0, "max_ms_all"]
    assert stopped_rows == 0


@pytest.mark.slow
def test_a_browser_without_webassembly_is_told_so_and_nothing_runs(assets, tmp_path, runtime_installed):
    html, sync_playwright, chromium = _open_panel(tmp_path, assets[0])
    with browser_measure.serve(html) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.add_init_script("delete globalThis.WebAssembly")
        page.goto(base + "index.html")
        page.wait_for_function("document.querySelector('.ortweb-env').textContent.length > 0", timeout=20_000)
        env_line = page.text_content(".ortweb-env")
        disabled = page.get_attribute(".ortweb-run", "disabled")
        browser.close()
    assert "has no WebAssembly" in env_line and disabled is not None
