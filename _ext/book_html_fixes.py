"""Small fixes to the rendered HTML that the browser test would otherwise (rightly) flag.

sphinx-thebe 0.3.1 registers its inline configuration script twice under Sphinx 7.4, so every page
declared ``const THEBE_JS_URL`` twice and raised a SyntaxError in the reader's console. This
extension drops exact duplicate script entries from each page's context.

It also lets long inline code wrap on a phone-sized screen (``static/book_html_fixes.css``), and owns
the book's repository URL, set in ONE place: ``book_repository_url`` under
``sphinx: config:`` in ``_config.yml``. While it is empty the repository, issues and launch (Binder,
Colab) buttons are absent; once it names the published repository they all point at it.
"""
from pathlib import Path


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # Inline scripts are registered once with filename None and once with "": the same script.
        filename = getattr(script, "filename", script) or ""
        key = (str(filename), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


# What the theme gets once the repository URL is set (Jupyter Book's `repository:`, `html.use_*_button`
# and `launch_buttons:` keys, which would otherwise each have to repeat the URL or break without it).
LAUNCH_BUTTONS = {"notebook_interface": "classic", "binderhub_url": "https://mybinder.org",
                  "colab_url": "https://colab.research.google.com"}


def repository_theme_options(url: str, branch: str = "main") -> dict:
    """The theme options that show the repository, issues and launch buttons; none for an empty URL."""
    url = (url or "").strip().rstrip("/")
    if not url:
        return {}
    return {"repository_url": url, "repository_branch": branch or "main", "path_to_docs": "",
            "use_repository_button": True, "use_issues_button": True,
            "launch_buttons": dict(LAUNCH_BUTTONS)}


def _apply_repository_url(app, config):
    options = dict(config.html_theme_options or {})
    for key in ("repository_url", "use_repository_button", "use_issues_button", "use_edit_page_button",
                "use_source_button", "launch_buttons"):
        options.pop(key, None)  # the one place is book_repository_url: nothing else may set these
    options.update(repository_theme_options(config.book_repository_url, config.book_repository_branch))
    config.html_theme_options = options


STATIC = Path(__file__).resolve().parent / "static"


def _add_static_path(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def setup(app):
    app.add_config_value("book_repository_url", "", "html", types=[str])
    app.add_config_value("book_repository_branch", "main", "html", types=[str])
    app.connect("config-inited", _apply_repository_url)
    # Inline code wraps on a phone instead of widening the page (static/book_html_fixes.css).
    app.connect("config-inited", _add_static_path)
    app.add_css_file("book_html_fixes.css")
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
