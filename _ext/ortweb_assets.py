"""Publishes the in-browser BlurBall of Chapter 4 with the book, offline, and adds its script to that page only.

The page's panel is a cell output (``graphbook.runtimes.browser_runtime.widget_html``). On the one page that holds
it, this extension adds ``_static/ortweb/widget.js`` (a module of a few kilobytes) and its stylesheet;
no other page gets them, and that script fetches nothing until the reader clicks. When the HTML build
finishes it copies, with ``graphbook.runtimes.browser_runtime.publish``, only the files the page can ask for
into ``_static/ortweb/``: onnxruntime-web's WebAssembly runtime (and its WebGPU build) from the pinned
``_ext/ortweb/node_modules``, and the exported models, clips and references of ``_ext/ortweb/assets``
(both made by ``scripts/setup_web.sh``). A missing file fails the build with one line saying to run it.
"""
from pathlib import Path

from sphinx.errors import ExtensionError

PANEL_MARKER = "data-ortweb-demo"


def _add_page_files(app, pagename, templatename, context, doctree):
    if PANEL_MARKER in (context.get("body") or ""):
        app.add_js_file("ortweb/widget.js", type="module")
        app.add_css_file("ortweb/widget.css")


def _publish(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    from graphbook.runtimes import browser_runtime

    try:
        browser_runtime.publish(Path(app.outdir) / "_static" / "ortweb")
    except browser_runtime.BrowserAssetsError as error:
        raise ExtensionError(f"Chapter 4's in-browser model: {error}") from None


def setup(app):
    app.connect("html-page-context", _add_page_files)
    app.connect("build-finished", _publish)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
