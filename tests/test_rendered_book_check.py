"""The browser check (scripts/check_rendered_book.py, run as test.sh runs it) must be able to fail a broken page."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from graphbook import paths
from conftest import slow_fixture

ROOT = paths.REPO_ROOT
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


FIGURE = ('<figure id="fig-a"><div class="cell_output"><img src="fig.png" alt="{alt}"></div>'
          '<figcaption><p><span class="caption-number">Fig. 1.{n} </span><span class="caption-text">A plot.</span>'
          '<a class="headerlink" href="#fig-a">#</a></p></figcaption></figure>')
# A table wider than a phone, in its own scroll box (as myst-nb's output area gives it): allowed.
WIDE_TABLE_IN_A_BOX = ('<div style="overflow-x: auto"><table><tr>'
                       + "".join(f"<th>column number {i}</th>" for i in range(12)) + "</tr><tr>"
                       + "".join(f"<td>{i}.5 nanoseconds</td>" for i in range(12)) + "</tr></table></div>")


def test_cli_refuses_a_folder_without_a_built_book_and_prints_the_browser_other_tests_use(tmp_path, script, capsys):
    with pytest.raises(SystemExit) as stop:
        script("scripts/check_rendered_book.py").main([str(tmp_path)])
    assert stop.value.code == 2 and "no built book" in capsys.readouterr().err
    assert script("scripts/check_rendered_book.py").main(["--print-browser"]) == 0
    browser = json.loads(capsys.readouterr().out)
    assert "--headless" in browser["args"] and (browser["chromium"] is None or Path(browser["chromium"]).exists())


BROKEN_PAGES = [
    # the page body is wider than a phone: a fixed-width block outside any scroll box
    ('<p>Text.</p><div style="width: 700px">a wide block</div>', "at 390 px the page is 7"),
    # a long unbreakable word sticks out even where the body is clipped
    ('<style>body { overflow-x: hidden }</style><p><code style="white-space: nowrap">'
     'torch._inductor.config.some_very_long_option_name_that_does_not_wrap</code></p>',
     "at 390 px 1 element(s) stick out of the page: code"),
    # a wide table NOT in a scroll box pushes the page sideways
    (WIDE_TABLE_IN_A_BOX.replace('style="overflow-x: auto"', ""), "scrolls sideways"),
    # pandas' missing value in a rendered table
    ("<table><tr><th>model</th><th>article</th></tr><tr><td>BlurBall</td><td>NaN</td></tr></table>",
     "1 table cell(s) show a missing value (NaN)"),
    ("<table><tr><td>&lt;NA&gt;</td><td>nan</td></tr></table>", "2 table cell(s) show a missing value (<NA>, nan)"),
    # dark mode: text hard-coded dark on the theme's dark background
    ('<style>html[data-theme=dark] body { background: #121212 } html[data-theme=dark] p { color: #222 }</style>'
     "<p>Unreadable at night.</p>", "in dark mode 1 text element(s) have contrast below 3:1: p"),
    # figures: a plot with no caption, one whose caption has no number, one whose alt text is its file name
    ('<div class="cell_output"><img src="fig.png" alt="a plot"></div>', "1 figures without a numbered caption"),
    ('<figure><img src="fig.png" alt="a plot"><figcaption><p>A plot.</p></figcaption></figure>',
     "1 figures without a numbered caption"),
    (FIGURE.format(alt="fig.png", n=1), "1 figures without real alt text"),
]


def _problems_by_page(proc) -> dict[str, str]:
    pages, page = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith(("FAIL ", "ok   ")):
            page = line[5:].split(" (")[0]
            pages[page] = ""
        elif line.startswith("       - ") and page is not None:
            pages[page] += " | " + line.strip()
    return pages


def _static_report(html, name, body="<p>tlparse report</p>"):
    """A published report beside the book's pages, as html_extra_path copies images/extra/tlparse."""
    (html / name / "-_0_0_0").mkdir(parents=True)
    (html / name / "index.html").write_text(PAGE.format(title="report", body=body))
    (html / name / "-_0_0_0" / "graph.txt").write_text("graph():\n")


@pytest.fixture(scope="module")
@slow_fixture
def broken_site_report(tmp_path_factory):
    """Every broken page in one site, checked by one browser session: index.html, a page per BROKEN_PAGES row, a
    chapter linking into the reports, a tlparse report with a console error, a provenance view no page links."""
    root = tmp_path_factory.mktemp("broken")
    html = _site(root, {
        "index.html": '<p>Eager took {glue:text}`eager_ms:.2f` ms, see {doc}`missing`.</p>'
                      '<img src="missing.png" alt="gone"><a href="nowhere.html">x</a><a href="index.html#nope">y</a>'
                      '<div class="cell_output"><pre>Traceback (most recent call last):\nValueError</pre></div>'
                      '<script>console.error("boom")</script>',
        "chapters/03.html": '<a href="../tlparse/index.html">report</a><a href="../tlparse/-_0_0_0/missing.txt">gone</a>'
                            '<a href="../tlparse_provenance/missing.html">provenance</a>',
        **{f"page{i}.html": body for i, (body, _) in enumerate(BROKEN_PAGES)}}, {"index.ipynb": _notebook_with_figures(2)})
    _static_report(html, "tlparse", body='<script>console.error("report boom")</script>')
    _static_report(html, "tlparse_provenance")
    proc = _check(html, "--screenshots", root / "shots", "--notebooks-root", root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc, _problems_by_page(proc)


def test_a_broken_page_and_the_reports_fail_on_each_defect(broken_site_report):
    proc, pages = broken_site_report
    assert any(line.startswith("FAIL index.html") for line in proc.stdout.splitlines()), proc.stdout
    for expected in ["unresolved role text '{glue:text}`'", "unresolved role text '{doc}`'",
                     "broken image 'missing.png'", "broken internal link 'nowhere.html'",
                     "missing anchor 'index.html#nope'", "traceback", "console error: boom",
                     "shows 0 figures but its notebook produced 2",
                     "1 glue references rendered empty"]:
        assert expected in pages["index.html"], f"{expected!r} not reported in: {pages['index.html']}"
    lines = proc.stdout.splitlines()  # a broken link into a report, a report's console error, an unpublished report
    assert "FAIL chapters/03.html (0 figures)" in lines and "FAIL tlparse/index.html (static report)" in lines
    assert "FAIL tlparse_provenance/index.html (static report)" in lines
    for page, expected in (("chapters/03.html", "broken link to the static report '../tlparse/-_0_0_0/missing.txt'"),
                           ("chapters/03.html", "broken link to the static report '../tlparse_provenance/missing.html'"),
                           ("tlparse/index.html", "console error: report boom"),
                           ("tlparse_provenance/index.html", "published, but no page of the book links it")):
        assert expected in pages[page], (page, pages[page])


@pytest.mark.parametrize("index", range(len(BROKEN_PAGES)), ids=[e[:40] for _, e in BROKEN_PAGES])
def test_each_new_check_fails_on_a_broken_page(broken_site_report, index):
    proc, pages = broken_site_report
    assert any(line.startswith(f"FAIL page{index}.html") for line in proc.stdout.splitlines()), proc.stdout
    assert BROKEN_PAGES[index][1] in pages[f"page{index}.html"], proc.stdout
