#!/usr/bin/env python
"""Open every page of the built book in headless Chromium and check it the way a reader sees it.

Usage: .venv/bin/python scripts/check_rendered_book.py [_build/html] [--screenshots DIR]

The book is served on loopback; each page is loaded in Debian's Chromium (driven by Playwright, no
browser download). A page fails on: a load error or HTTP error, a console error or uncaught
exception, a broken image, an internal link to a missing page or anchor, glue or role text left
unresolved (``{glue:text}`...```), a traceback or error output in a cell, math that MathJax did not
typeset, fewer figures than its notebook produced, a figure without real alt text or without a
numbered caption, or ``NaN`` (``NaT``, ``<NA>``) in a table cell. Each page is then opened twice more:
in a phone-sized window (390 px wide), where the page body must not scroll sideways (a wide table in
its own scroll container is fine), and in the theme's dark mode, where text must stay readable
(contrast at least 3:1 against its background). Static reports the book publishes as they are
(``STATIC_REPORTS``: tlparse's report and its provenance view, copied from ``images/extra/`` by ``html_extra_path``) are not book
pages: a link from a page into one must resolve to a file of the built site, and the report's
``index.html`` must be linked from a page and load without an HTTP error, failed request, console
error or uncaught exception.
A page with Chapter 4's in-browser panel (``[data-ortweb-demo]``) is also run the way a reader runs it: the
check at the default size (96x160) must pass and a time must appear (``check_browser_panel``); a panel whose
check fails, or that shows no time, fails the page.
Full-page screenshots of all three views go to
``_build/screenshots/`` (``<page>.png``, ``<page>--phone.png``, ``<page>--dark.png``) for a person to
look at, and the report lists each page's figures. Exit 0 when every page passes, 1 otherwise, 2 on
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
from urllib.parse import unquote, urljoin, urlparse

from graphbook import paths

ROOT = paths.REPO_ROOT
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Folders published as they are (``_config.yml``'s html_extra_path): checked by their index page only.
STATIC_REPORTS = ("tlparse", "tlparse_provenance")
SKIP_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "reports", *STATIC_REPORTS}
UNRESOLVED = re.compile(r"\{(?:glue(?::\w+)?|cite(?::\w+)?|doc|numref|ref|eq|download)\}`?")
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}  # a phone held upright (CSS pixels)
MIN_DARK_CONTRAST = 3.0  # WCAG's floor for large text; black-on-dark text scores about 1.2


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


def check_links(html_dir: Path, page: Path, hrefs: list[str], base: str, cache: dict,
                linked: set[str] | None = None) -> list[str]:
    """Problems with a page's internal links; ``linked`` collects the site paths they reach."""
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
        if target.exists() and linked is not None and target.is_relative_to(html_dir):
            linked.add(target.relative_to(html_dir).as_posix())
        if not target.exists():
            rel = target.relative_to(html_dir).parts if target.is_relative_to(html_dir) else ()
            kind = "link to the static report" if rel and rel[0] in STATIC_REPORTS else "internal link"
            problems.append(f"broken {kind} {href!r}")
        elif parsed.fragment and target.suffix == ".html" and parsed.fragment not in _anchor_ids(target, cache):
            problems.append(f"link to a missing anchor {href!r}")
    return problems


# Content of the page: the article where the theme has one, else <main>, else <body>.
_CONTENT = "(document.querySelector('article') || document.querySelector('main') || document.body)"
_DESCRIBE = """el => { const cls = (el.getAttribute('class') || '').trim().split(/\\s+/).slice(0, 2).join('.');
  const text = (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 40);
  return el.tagName.toLowerCase() + (cls ? '.' + cls : '') + (text ? ` "${text}"` : ''); }"""

# Sideways overflow at the current window width: does the document scroll sideways, and which content
# elements stick out past the window without a scroll container of their own inside the content?
OVERFLOW_JS = """() => {
  const describe = %s, content = %s, width = document.documentElement.clientWidth;
  const pageWidth = Math.max(document.documentElement.scrollWidth, document.body.scrollWidth);
  const contained = el => { for (let e = el.parentElement; e && e !== content; e = e.parentElement) {
      const o = getComputedStyle(e).overflowX; if (o !== 'visible') return true; } return false; };
  const out = [];
  for (const el of content.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || r.right <= width + 1 || contained(el)) continue;
    if (out.length && out[out.length - 1].contains(el)) continue;  // report the outermost only
    out.push(el);
  }
  // Boxes that scroll sideways on their own (a wide table in its output area): allowed, but noted.
  const scrollers = [...content.querySelectorAll('*')].filter(e => e.scrollWidth > e.clientWidth + 1
      && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && e.querySelector('table'));
  return {width, pageWidth, offenders: out.slice(0, 3).map(describe), count: out.length,
          scrollingTables: scrollers.length};
}""" % (_DESCRIBE, _CONTENT)

# Text in the content whose colour is too close to the background it is drawn on.
CONTRAST_JS = """(minimum) => {
  const describe = %s, content = %s;
  const parse = c => { const m = /rgba?\\(([^)]+)\\)/.exec(c); if (!m) return null;
    const p = m[1].split(',').map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const background = el => { for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor); if (c && c.a >= 0.5) return c; }
    return {r: 255, g: 255, b: 255, a: 1}; };
  const bad = [];
  for (const el of content.querySelectorAll('p, li, td, th, dt, dd, pre, figcaption, h1, h2, h3, h4, span.pasted-text')) {
    if (!el.textContent.trim() || !el.getClientRects().length) continue;
    const style = getComputedStyle(el); if (style.visibility === 'hidden') continue;
    const fg = parse(style.color); if (!fg) continue;
    const l1 = lum(fg), l2 = lum(background(el));
    const ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    if (ratio < minimum) bad.push(describe(el) + ` (${ratio.toFixed(1)}:1)`);
  }
  return bad;
}""" % (_DESCRIBE, _CONTENT)

# Figures on the page: every image in the content, grouped by its <figure> where it has one.
FIGURES_JS = """() => {
  const content = %s, figures = [];
  for (const img of content.querySelectorAll('img')) {
    const figure = img.closest('figure');
    if (figure && figures.some(f => f.figure === figure)) continue;
    const caption = figure && figure.querySelector('figcaption');
    const number = caption && caption.querySelector('.caption-number');
    const captionText = caption ? caption.textContent.replace(number ? number.textContent : '', '').replace('#', '').trim() : '';
    const alt = (img.getAttribute('alt') || '').trim();
    figures.push({figure, src: img.getAttribute('src'), number: number ? number.textContent.trim() : '',
                  captioned: !!(number && captionText), alt: !!alt && !/\\.(png|jpe?g|svg|gif)$/i.test(alt)});
  }
  return figures.map(({figure, ...rest}) => rest);
}""" % _CONTENT

# Missing values that pandas prints when a table has no figure for a cell.
MISSING_VALUE = re.compile(r"(?<![A-Za-z])(NaN|nan|NaT|<NA>)(?![A-Za-z])")


def _dark_mode_init():
    """Before any page script runs: ask the pydata theme (and the OS preference) for dark mode."""
    return "try { localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark'); } catch (e) {}"


def _load(page, url: str, problems: list[str] | None, settle: bool = True) -> bool:
    """Load ``url``; with ``settle``, also wait until the network has been idle for half a second, so that late
    requests and their console errors are seen (the phone and dark views of a page already judged need only layout)."""
    try:
        response = page.goto(url, wait_until="load", timeout=60_000)
        if response is None or response.status >= 400:
            if problems is not None:
                problems.append(f"page did not load (HTTP {response.status if response else 'none'})")
            return False
        if settle:
            page.wait_for_load_state("networkidle", timeout=30_000)
        return True
    except Exception as err:  # a page that cannot load is the first thing to report
        if problems is not None:
            problems.append(f"page did not load: {err}")
        return False


def check_phone(page, notes: list[str] | None = None) -> list[str]:
    """At the phone width the page body must not scroll sideways, and no content may stick out of it.

    Tables wider than the phone inside their own scroll box pass, and are counted in ``notes``.
    """
    found = page.evaluate(OVERFLOW_JS)
    if found["scrollingTables"] and notes is not None:
        notes.append(f"at {PHONE['width']} px {found['scrollingTables']} table(s) scroll sideways in their own box")
    problems = []
    if found["pageWidth"] > found["width"] + 1:
        problems.append(f"at {PHONE['width']} px the page is {found['pageWidth']} px wide and scrolls sideways")
    if found["count"]:
        problems.append(f"at {PHONE['width']} px {found['count']} element(s) stick out of the page: "
                        + "; ".join(found["offenders"]))
    return problems


def check_dark(page) -> list[str]:
    """In dark mode, text must keep a readable contrast with what it is drawn on."""
    page.evaluate("() => { const d = document.documentElement;"
                  " if (d.dataset.theme !== 'dark') { d.dataset.theme = 'dark'; d.dataset.mode = 'dark'; } }")
    bad = page.evaluate(CONTRAST_JS, MIN_DARK_CONTRAST)
    if not bad:
        return []
    return [f"in dark mode {len(bad)} text element(s) have contrast below {MIN_DARK_CONTRAST:g}:1: " + "; ".join(bad[:3])]


PANEL = "[data-ortweb-demo]"
PANEL_TIMEOUT_MS = 240_000  # loading the 14 MB runtime, checking two levels and timing a few calls
PANEL_REPEATS = "3"         # timed calls per level: enough to see a time appear, short for CI


def check_browser_panel(page) -> list[str]:
    """Chapter 4's in-browser panel, clicked: its check must pass and a time must appear.

    The panel runs onnxruntime-web on the book's own model at the default size; nothing is clicked on a
    page without it. Returns the problems (the panel's own words when its check fails).
    """
    if page.query_selector(PANEL) is None:
        return []
    text = lambda sel: (page.text_content(f"{PANEL} {sel}") or "").strip()  # noqa: E731
    try:
        page.wait_for_function(f"() => !document.querySelector('{PANEL} .ortweb-run').disabled", timeout=20_000)
    except Exception:
        return [f"the in-browser panel never became ready: {text('.ortweb-status')!r} {text('.ortweb-env')!r}"]
    page.fill(f"{PANEL} .ortweb-repeats", PANEL_REPEATS)
    page.click(f"{PANEL} .ortweb-run")
    try:
        page.wait_for_function(
            f"""() => {{ const r = document.querySelector('{PANEL}');
                return r.querySelector('.ortweb-results').dataset.done === 'true'
                    || r.querySelector('.ortweb-check').dataset.state === 'fail'; }}""", timeout=PANEL_TIMEOUT_MS)
    except Exception:
        return [f"the in-browser panel did not finish within {PANEL_TIMEOUT_MS // 1000} s: {text('.ortweb-status')!r}"]
    state = page.get_attribute(f"{PANEL} .ortweb-check", "data-state")
    if state != "pass":
        return [f"the in-browser check did not pass: {text('.ortweb-check')}"]
    cells = page.eval_on_selector_all(f"{PANEL} .ortweb-results tbody tr td:nth-child(2)", "els => els.map(e => e.textContent)")
    timed = [c for c in cells if re.match(r"^\d+(?:\.\d+)? \(", c)]
    if len(timed) < 2:
        return [f"the in-browser check passed but no time appeared: {cells!r}"]
    return []


def check_tables(page) -> list[str]:
    """A table cell must say what is missing ("not reported"), not show pandas' NaN."""
    cells = page.evaluate(f"() => [...{_CONTENT}.querySelectorAll('td, th')].map(c => c.textContent.trim())")
    bad = [cell for cell in cells if MISSING_VALUE.search(cell)]
    if not bad:
        return []
    return [f"{len(bad)} table cell(s) show a missing value ({', '.join(sorted(set(MISSING_VALUE.findall(' '.join(bad)))))}); "
            "say what is missing instead (e.g. 'not reported')"]


def check_figures(page) -> tuple[int, list[str]]:
    """The page's figures, and the problems with them: each needs real alt text and a numbered caption."""
    figures = page.evaluate(FIGURES_JS)
    problems = []
    no_alt = [f["src"] for f in figures if not f["alt"]]
    if no_alt:
        problems.append(f"{len(no_alt)} figures without real alt text (set mystnb.image.alt): {', '.join(no_alt[:3])}")
    uncaptioned = [f["src"] for f in figures if not f["captioned"]]
    if uncaptioned:
        problems.append(f"{len(uncaptioned)} figures without a numbered caption (mystnb.figure.caption or a "
                        f"figure directive): {', '.join(uncaptioned[:3])}")
    return len(figures), problems


def check_site(html_dir: Path, screenshots: Path | None = None, notebooks_root: Path = ROOT,
               figure_counts: dict[str, int] | None = None,
               notes: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Problems found per page (relative path -> list of messages); an empty list means the page passed.

    ``figure_counts``, when given, is filled with the number of figures on each page, and ``notes`` with
    remarks that do not fail a page (tables that scroll in their own box on a phone).
    """
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("Chromium is not installed: run `apt-get install chromium` (scripts/setup_browser.sh)")
    server, base = serve(html_dir)
    report: dict[str, list[str]] = {}
    anchors: dict = {}
    linked: set[str] = set()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport=DESKTOP)
            phone = browser.new_context(viewport=PHONE)
            dark = browser.new_context(viewport=DESKTOP, color_scheme="dark")
            dark.add_init_script(_dark_mode_init())
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
                if not _load(page, base + rel, problems):
                    report[rel] = problems
                    page.close()
                    continue
                # A redirect page (index.html -> intro.html) is checked as the page it lands on.
                landed = urlparse(page.url).path[len(urlparse(base).path):]
                if landed and (html_dir / unquote(landed)).is_file():
                    page_path = html_dir / unquote(landed)
                problems += _check_page(page, html_dir, page_path, base, anchors, notebooks_root, linked)
                problems += check_browser_panel(page)
                problems += check_tables(page)
                n_figures, figure_problems = check_figures(page)
                problems += figure_problems
                if figure_counts is not None:
                    figure_counts[rel] = n_figures
                shot, landed_url = None, page.url
                if screenshots is not None:
                    shot = screenshots / (rel.replace("/", "__").removesuffix(".html") + ".png")
                    shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shot), full_page=True)
                page.close()
                # The same page on a phone and in dark mode (console messages were judged above), loaded where the
                # first load landed: a redirect would navigate away under the checks.
                page_notes = notes.setdefault(rel, []) if notes is not None else None
                for view, check, suffix in ((phone, functools.partial(check_phone, notes=page_notes), "--phone"),
                                            (dark, check_dark, "--dark")):
                    other = view.new_page()
                    if _load(other, landed_url, problems, settle=False):
                        problems += check(other)
                        if shot is not None:
                            other.screenshot(path=str(shot.with_name(shot.stem + suffix + ".png")), full_page=True)
                    other.close()
                report[rel] = problems
            for name in STATIC_REPORTS:
                if (html_dir / name / "index.html").is_file():
                    rel = f"{name}/index.html"
                    report[rel] = check_static_report(context, base, rel)
                    if rel not in linked:
                        report[rel].append("published, but no page of the book links it")
            browser.close()
    finally:
        server.shutdown()
    return report


def check_static_report(context, base: str, rel: str) -> list[str]:
    """A published report's page (not a book page): it must load with no HTTP error, failed request,
    console error or uncaught exception. The book's own page checks (theme, figures, glue) do not apply."""
    problems: list[str] = []
    page = context.new_page()
    page.on("console", lambda msg: problems.append(f"console error: {msg.text} ({msg.location.get('url', '')})")
            if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(f"uncaught exception: {exc}"))
    page.on("response", lambda resp: problems.append(f"HTTP {resp.status}: {resp.url}")
            if resp.status >= 400 and resp.url.startswith(base) else None)
    page.on("requestfailed", lambda req: problems.append(f"request failed: {req.url}")
            if req.url.startswith(base) else None)
    _load(page, base + rel, problems)
    page.close()
    return problems


def _check_page(page, html_dir, page_path, base, anchors, notebooks_root, linked=None) -> list[str]:
    problems = []
    broken = page.eval_on_selector_all(
        "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).map(e => e.getAttribute('src'))")
    problems += [f"broken image {src!r}" for src in broken]
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    problems += check_links(html_dir, page_path, hrefs, base, anchors, linked)
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
        # myst-nb renders a glue key it cannot find as nothing at all, so count the filled-in values.
        glued = page.eval_on_selector_all("[class^='pasted-']", "els => els.filter(e => e.textContent.trim()).length")
        expected_glue = notebook_glue_references(notebook)
        if glued < expected_glue:
            problems.append(f"{expected_glue - glued} glue references rendered empty (unresolved glue keys)")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html_dir", nargs="?", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--screenshots", type=Path, default=ROOT / "_build" / "screenshots")
    parser.add_argument("--notebooks-root", type=Path, default=ROOT)
    parser.add_argument("--print-browser", action="store_true",
                        help="print the Chromium path and flags this check uses as JSON and exit (other "
                             "browser tests launch the same browser the same way)")
    args = parser.parse_args(argv)
    if args.print_browser:
        print(json.dumps({"chromium": find_chromium(), "args": CHROMIUM_ARGS}))
        return 0
    if not (args.html_dir / "index.html").exists():
        parser.error(f"{args.html_dir} holds no built book (index.html missing): build it first")
    figures: dict[str, int] = {}
    notes: dict[str, list[str]] = {}
    try:
        report = check_site(args.html_dir, args.screenshots, args.notebooks_root, figure_counts=figures, notes=notes)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = {page: probs for page, probs in report.items() if probs}
    for page, probs in report.items():
        n = figures.get(page, 0)
        what = "static report" if page.split("/")[0] in STATIC_REPORTS else f"{n} figure{'' if n == 1 else 's'}"
        print(f"{'FAIL' if probs else 'ok  '} {page} ({what})")
        for problem in probs:
            print(f"       - {problem}")
        for note in notes.get(page, []):
            print(f"       note: {note}")
    print(f"{len(report) - len(failed)} passed, {len(failed)} failed; {sum(figures.values())} figures in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
