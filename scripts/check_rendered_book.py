#!/usr/bin/env python
"""Open every page of the built book in headless Chromium and check it the way a reader sees it.

Usage: .venv/bin/python scripts/check_rendered_book.py [_build/html] [--screenshots DIR]

The book is served on loopback; each page is loaded in Debian's Chromium (driven by Playwright, no
browser download). A page fails on: a load error or HTTP error, a console error or uncaught
exception, a broken image, an internal link to a missing page or anchor, glue or role text left
unresolved (``{glue:text}`...```), a traceback or error output in a cell, math that MathJax did not
typeset, or fewer figures than its notebook produced. A full-page screenshot of each page goes to
``_build/screenshots/`` for a person to look at. Exit 0 when every page passes, 1 otherwise, 2 on
bad usage.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urljoin, urlparse, unquote

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SKIP_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "reports"}
UNRESOLVED = re.compile(r"\{(?:glue(?::\w+)?|cite(?::\w+)?|doc|numref|ref|eq|download)\}`?")
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")


def find_chromium() -> str | None:
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


def pages(html_dir: Path) -> list[Path]:
    return sorted(p for p in html_dir.rglob("*.html")
                  if not (set(p.relative_to(html_dir).parts[:-1]) & SKIP_DIRS))


# {glue} and {glue:text} render inside a span with a "pasted-" class; {glue:md} is parsed into plain
# markup with no wrapper, so it cannot be counted on the page (the -W build catches its missing keys).
GLUE_ROLE = re.compile(r"\{glue(?::text)?\}`[^`]+`")


def notebook_glue_references(notebook: Path) -> int:
    """Inline {glue}/{glue:text} references in a notebook's prose; each must render as a filled-in value."""
    nb = json.loads(notebook.read_text())
    text = "\n".join("".join(c.get("source", [])) for c in nb.get("cells", []) if c.get("cell_type") == "markdown")
    return len(GLUE_ROLE.findall(text))


def notebook_figures(notebook: Path) -> int:
    """Images a notebook's stored outputs show on the page (cells whose output is removed excluded)."""
    nb = json.loads(notebook.read_text())
    count = 0
    for cell in nb.get("cells", []):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.get("cell_type") != "code" or tags & {"remove-output", "remove-cell"}:
            continue
        for out in cell.get("outputs", []):
            if any(m in out.get("data", {}) for m in IMAGE_MIMES):
                count += 1
    return count


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the checker reports problems itself
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # The browser closing a connection early (navigation, favicon) is not a defect of the book.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(html_dir: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _anchor_ids(path: Path, cache: dict) -> set[str]:
    if path not in cache:
        cache[path] = set(re.findall(r'\bid="([^"]+)"', path.read_text(errors="replace")))
    return cache[path]


def check_links(html_dir: Path, page: Path, hrefs: list[str], base: str, cache: dict) -> list[str]:
    problems = []
    page_url = urljoin(base, page.relative_to(html_dir).as_posix())
    for href in hrefs:
        url = urljoin(page_url, href)
        parsed = urlparse(url)
        if not url.startswith(base) or parsed.scheme not in ("http", "https"):
            continue  # external links are not fetched (no network); internal ones must resolve
        target = html_dir / unquote(parsed.path[len(urlparse(base).path):])
        if target.is_dir():
            target = target / "index.html"
        if not target.exists():
            problems.append(f"broken internal link {href!r}")
        elif parsed.fragment and target.suffix == ".html" and parsed.fragment not in _anchor_ids(target, cache):
            problems.append(f"link to a missing anchor {href!r}")
    return problems


def check_site(html_dir: Path, screenshots: Path | None = None, notebooks_root: Path = ROOT) -> dict[str, list[str]]:
    """Problems found per page (relative path -> list of messages); an empty list means the page passed."""
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("Chromium is not installed: run `apt-get install chromium` (scripts/setup_browser.sh)")
    server, base = serve(html_dir)
    report: dict[str, list[str]] = {}
    anchors: dict = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            for page_path in pages(html_dir):
                rel = page_path.relative_to(html_dir).as_posix()
                problems: list[str] = []
                page = context.new_page()
                page.on("console", lambda msg, p=problems: p.append(f"console error: {msg.text} ({msg.location.get('url', '')})")
                        if msg.type == "error" else None)
                page.on("pageerror", lambda exc, p=problems: p.append(f"uncaught exception: {exc}"))
                page.on("response", lambda resp, p=problems: p.append(f"HTTP {resp.status}: {resp.url}")
                        if resp.status >= 400 and resp.url.startswith(base) else None)
                page.on("requestfailed", lambda req, p=problems: p.append(f"request failed: {req.url}")
                        if req.url.startswith(base) else None)
                try:
                    response = page.goto(base + rel, wait_until="load", timeout=60_000)
                    if response is None or response.status >= 400:
                        problems.append(f"page did not load (HTTP {response.status if response else 'none'})")
                    page.wait_for_load_state("networkidle", timeout=30_000)
                except Exception as err:  # a page that cannot load is the first thing to report
                    problems.append(f"page did not load: {err}")
                    report[rel] = problems
                    page.close()
                    continue
                # A redirect page (index.html -> intro.html) is checked as the page it lands on.
                landed = urlparse(page.url).path[len(urlparse(base).path):]
                if landed and (html_dir / unquote(landed)).is_file():
                    page_path = html_dir / unquote(landed)
                problems += _check_page(page, html_dir, page_path, base, anchors, notebooks_root)
                if screenshots is not None:
                    shot = screenshots / (rel.replace("/", "__").removesuffix(".html") + ".png")
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shot), full_page=True)
                report[rel] = problems
                page.close()
            browser.close()
    finally:
        server.shutdown()
    return report


def _check_page(page, html_dir, page_path, base, anchors, notebooks_root) -> list[str]:
    problems = []
    broken = page.eval_on_selector_all(
        "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).map(e => e.getAttribute('src'))")
    problems += [f"broken image {src!r}" for src in broken]
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    problems += check_links(html_dir, page_path, hrefs, base, anchors)
    main = page.inner_text("main") if page.query_selector("main") else page.inner_text("body")
    for match in sorted(set(UNRESOLVED.findall(main))):
        problems.append(f"unresolved role text {match!r} left in the page")
    if "Traceback (most recent call last)" in main or page.query_selector(".cell_output .traceback, .output.traceback"):
        problems.append("a cell shows a traceback or error output")
    if page.query_selector("div.math, span.math"):
        try:
            page.wait_for_selector("mjx-container", timeout=20_000)
        except Exception:
            problems.append("math on the page was not typeset by MathJax")
    rel = page_path.relative_to(html_dir)
    notebook = notebooks_root / rel.with_suffix(".ipynb")
    if notebook.exists():
        expected = notebook_figures(notebook)
        shown = len(page.query_selector_all(".cell_output img"))
        if shown < expected:
            problems.append(f"shows {shown} figures but its notebook produced {expected}")
        # myst-nb's fallback alt text is the image's own path, which tells a screen reader nothing.
        # myst-nb renders a glue key it cannot find as nothing at all, so count the filled-in values.
        glued = page.eval_on_selector_all("[class^='pasted-']", "els => els.filter(e => e.textContent.trim()).length")
        expected_glue = notebook_glue_references(notebook)
        if glued < expected_glue:
            problems.append(f"{expected_glue - glued} glue references rendered empty (unresolved glue keys)")
        missing_alt = page.eval_on_selector_all(
            ".cell_output img", "els => els.filter(e => { const a = (e.getAttribute('alt') || '').trim();"
            " return !a || /\\.(png|jpe?g|svg)$/i.test(a); }).length")
        if missing_alt:
            problems.append(f"{missing_alt} figures without real alt text (set mystnb.image.alt)")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html_dir", nargs="?", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--screenshots", type=Path, default=ROOT / "_build" / "screenshots")
    parser.add_argument("--notebooks-root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    if not (args.html_dir / "index.html").exists():
        parser.error(f"{args.html_dir} holds no built book (index.html missing): build it first")
    try:
        report = check_site(args.html_dir, args.screenshots, args.notebooks_root)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = {page: probs for page, probs in report.items() if probs}
    for page, probs in report.items():
        print(f"{'FAIL' if probs else 'ok  '} {page}")
        for problem in probs:
            print(f"       - {problem}")
    print(f"{len(report) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
