"""The browser check itself must be able to fail: a deliberately broken page is caught, a clean one passes.

scripts/check_rendered_book.py is run as the command test.sh runs, in a subprocess (a script is not a module
to import), and judged by its exit status and its report.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_rendered_book.py"


def _check(html, *options):
    """Run the checker on ``html``; skip where the script says Chromium is missing."""
    proc = subprocess.run([sys.executable, str(SCRIPT), str(html), *map(str, options)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 2 and "Chromium is not installed" in proc.stderr:
        pytest.skip("needs Chromium (scripts/setup_browser.sh installs it; test.sh runs that first)")
    return proc


PNG_1PX = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{title}</title></head>
<body><main>{body}</main></body></html>"""


def _site(tmp_path, pages, notebooks=None):
    html = tmp_path / "html"
    html.mkdir()
    (html / "fig.png").write_bytes(PNG_1PX)
    for name, body in pages.items():
        target = html / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(PAGE.format(title=name, body=body))
    for name, nb in (notebooks or {}).items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb))
    return html


def _notebook_with_figures(n, prose="Eager took {glue:text}`eager_ms:.1f` ms."):
    out = {"output_type": "display_data", "data": {"image/png": "iVBOR"}, "metadata": {}}
    return {"cells": [{"cell_type": "markdown", "source": prose, "metadata": {}},
                      {"cell_type": "code", "source": "plot()", "metadata": {}, "outputs": [out] * n}],
            "metadata": {}}


def test_a_clean_page_passes(tmp_path):
    html = _site(tmp_path, {
        "index.html": '<p>Eager took <span class="pasted-text">12.5</span> ms.</p><a href="other.html#sec">next</a>'
                      '<div class="cell_output"><img src="fig.png" alt="a plot"></div>',
        "other.html": '<h2 id="sec">Section</h2>',
    }, {"index.ipynb": _notebook_with_figures(1)})
    proc = _check(html, "--screenshots", tmp_path / "shots", "--notebooks-root", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["ok   index.html", "ok   other.html", "2 passed, 0 failed"]
    assert (tmp_path / "shots" / "index.png").stat().st_size > 0


def test_a_broken_page_fails_on_each_defect(tmp_path):
    html = _site(tmp_path, {
        "index.html": '<p>Eager took {glue:text}`eager_ms:.2f` ms, see {doc}`missing`.</p>'
                      '<img src="missing.png" alt="gone"><a href="nowhere.html">x</a><a href="index.html#nope">y</a>'
                      '<div class="cell_output"><pre>Traceback (most recent call last):\nValueError</pre></div>'
                      '<script>console.error("boom")</script>',
    }, {"index.ipynb": _notebook_with_figures(2)})
    proc = _check(html, "--screenshots", tmp_path / "shots", "--notebooks-root", tmp_path)
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL index.html"), proc.stdout + proc.stderr
    problems = " | ".join(line.strip() for line in proc.stdout.splitlines() if line.startswith("       - "))
    for expected in ["unresolved role text '{glue:text}`'", "unresolved role text '{doc}`'",
                     "broken image 'missing.png'", "broken internal link 'nowhere.html'",
                     "missing anchor 'index.html#nope'", "traceback", "console error: boom",
                     "shows 0 figures but its notebook produced 2",
                     "1 glue references rendered empty"]:
        assert expected in problems, f"{expected!r} not reported in: {problems}"


def test_cli_refuses_a_folder_without_a_built_book(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no built book" in proc.stderr and "Traceback" not in proc.stderr
