"""The laptop reader's path, as the README documents it: `.venv/bin/jupyter lab <chapter>` after set-up, on loopback,
Chapter 1's opening cells run with Shift+Enter in headless Chromium until the first measuring cell's output shows."""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from graphbook import paths
from graphbook.serving.litserve_compare import _free_port

ROOT = paths.REPO_ROOT
CHAPTER = ROOT / "chapters" / "01_chef_and_refrigerator.ipynb"
JUPYTER = Path(sys.executable).with_name("jupyter")
# Chapter 1's cells up to and including the first one that prints (the machine's bandwidth and peak).
EXPECTED_OUTPUT = "ridge point:"
START_TIMEOUT_S = 90
RUN_TIMEOUT_S = 240  # everything in the browser together: load, kernel start, the cells


def _browser_launcher():
    """check_rendered_book's Chromium path and flags, as the script prints them (a script is not a module)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_rendered_book.py"), "--print-browser"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    browser = json.loads(proc.stdout)
    return browser["chromium"], browser["args"]


def _opening_cells(target: Path) -> int:
    """Write Chapter 1 up to its first printing cell, outputs cleared; return the number of cells."""
    nb = nbformat.read(CHAPTER, as_version=4)
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "code":
            printed = "".join(out.get("text", "") for out in cell.outputs)
            cell.outputs, cell.execution_count = [], None
            if EXPECTED_OUTPUT in printed:
                break
    else:
        raise AssertionError(f"no cell of {CHAPTER.name} prints {EXPECTED_OUTPUT!r} any more: update this test")
    nb.cells = cells
    nbformat.write(nb, target)
    return len(cells)


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with status {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _shut_down(proc: subprocess.Popen, base: str, token: str) -> None:
    """Ask the server to stop (it stops its kernels), then terminate, then kill its process group."""
    if proc.poll() is None:
        try:
            req = urllib.request.Request(f"{base}api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(req, timeout=10).close()
        except OSError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    try:  # anything left in the server's own process group (its session), kernels included
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)


@pytest.mark.slow
def test_jupyter_lab_runs_a_chapter_in_the_browser(tmp_path):
    assert JUPYTER.exists() and shutil.which("jupyter-lab", path=str(JUPYTER.parent)), (
        "JupyterLab is not installed in this environment: run `bash scripts/setup_env.sh` (requirements.txt pins it)")
    chromium, chromium_args = _browser_launcher()
    if chromium is None:
        pytest.skip("needs Chromium (scripts/setup_browser.sh installs it; test.sh runs that first)")
    from playwright.sync_api import sync_playwright

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    n_cells = _opening_cells(notebooks / "chapter1.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}/"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    log = tmp_path / "jupyter.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [str(JUPYTER), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
             "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly",
             *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI runs as root
            cwd=notebooks, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_server(f"{base}api/status?token={token}", proc, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=chromium_args)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                deadline = time.monotonic() + RUN_TIMEOUT_S

                def left_ms():  # every wait shares one budget, so the whole test stays bounded
                    return max(1.0, deadline - time.monotonic()) * 1000

                page.set_default_timeout(left_ms())
                page.goto(f"{base}lab/tree/chapter1.ipynb?token={token}", wait_until="load")
                # The notebook is open and its kernel has started (the status bar names it and says Idle).
                first = page.locator(".jp-NotebookPanel .jp-Cell").first
                first.wait_for(state="visible")
                # Keys pressed before the kernel is connected run nothing: wait for the status bar's "Idle".
                page.set_default_timeout(left_ms())
                page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(state="visible")
                first.locator(".jp-InputPrompt").first.click()  # select the first cell (command mode)
                for index in range(n_cells):
                    page.keyboard.press("Shift+Enter")
                    page.set_default_timeout(left_ms())
                    if page.locator(".jp-NotebookPanel .jp-Cell").nth(index).get_attribute("class").count("jp-CodeCell"):
                        # a code cell: wait until it has run (its prompt shows an execution count)
                        page.locator(".jp-NotebookPanel .jp-Cell").nth(index).locator(
                            ".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(state="visible")
                output = page.locator(".jp-OutputArea-output", has_text=EXPECTED_OUTPUT)
                page.set_default_timeout(left_ms())
                try:
                    output.first.wait_for(state="visible")
                except Exception:
                    page.screenshot(path=str(tmp_path / "jupyterlab.png"))
                    shown = page.locator(".jp-OutputArea-output").all_inner_texts()
                    pytest.fail(f"no output {EXPECTED_OUTPUT!r} within {RUN_TIMEOUT_S} s; outputs shown: {shown}; "
                                f"screenshot {tmp_path / 'jupyterlab.png'}; server log:\n{log.read_text()[-2000:]}")
                text = output.first.inner_text()
                errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                tracebacks = [e for e in errors.all_inner_texts() if "Traceback" in e or "Error" in e]
            finally:
                browser.close()
    finally:
        _shut_down(proc, base, token)
    assert EXPECTED_OUTPUT in text and "GB/s" in text, text
    assert not tracebacks, tracebacks
    assert proc.returncode is not None
