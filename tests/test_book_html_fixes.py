"""_ext/book_html_fixes.py: the repository and launch buttons exist only once the book's repository URL is
set, in its one place (``book_repository_url`` under ``sphinx: config:`` in _config.yml)."""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from graphbook import paths

ROOT = paths.REPO_ROOT
URL = "https://github.com/example-org/example-book"


def test_the_url_is_the_only_switch_and_set_in_one_place(script):
    """Buttons switched on in theme options are dropped while the URL is empty; a URL turns every button on."""
    from types import SimpleNamespace

    fixes = script("_ext/book_html_fixes.py")
    config = SimpleNamespace(html_theme_options={"repository_url": "https://example.org/stale", "use_issues_button": True,
                                                 "launch_buttons": {"colab_url": "x"}, "home_page_in_toc": True},
                             book_repository_url="", book_repository_branch="main")
    fixes._apply_repository_url(None, config)  # the extension loaded from its file, as local_extensions does
    assert config.html_theme_options == {"home_page_in_toc": True}
    assert fixes.repository_theme_options("   ") == {}
    options = fixes.repository_theme_options(f"{URL}/", "dev")
    assert options["repository_url"] == URL and options["repository_branch"] == "dev"
    assert options["use_repository_button"] and options["use_issues_button"]
    assert options["launch_buttons"]["binderhub_url"] and options["launch_buttons"]["colab_url"]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "book_repository_url" in config["sphinx"]["config"]
    assert "repository" not in config and "launch_buttons" not in config
    assert not {"use_repository_button", "use_issues_button", "use_edit_page_button"} & set(config.get("html", {}))


def _tiny_book(folder: Path, url: str) -> Path:
    folder.mkdir()
    (folder / "_config.yml").write_text(yaml.safe_dump({
        "title": "tiny", "execute": {"execute_notebooks": "off"}, "only_build_toc_files": True,
        "sphinx": {"local_extensions": {"book_html_fixes": str(ROOT / "_ext")},
                   "config": {"book_repository_url": url}}}))
    (folder / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: page\n")
    (folder / "intro.md").write_text("# Intro\n\nHello.\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Page"), nbformat.v4.new_code_cell("1 + 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "page.ipynb")
    proc = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", "-W", "-n", "--quiet", str(folder)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder / "_build" / "html" / "page.html"


@pytest.mark.slow
def test_a_built_page_has_the_buttons_only_with_a_url(tmp_path):
    without = _tiny_book(tmp_path / "without", "").read_text()
    with_url = _tiny_book(tmp_path / "with", URL).read_text()
    for marker in ("source-repository-button", "mybinder.org", "colab.research.google.com", "/issues/new"):
        assert marker not in without, marker
        assert marker in with_url, marker
    assert URL in with_url
    # long inline code wraps on a phone: the extension's stylesheet is linked and shipped
    assert "book_html_fixes.css" in without
    assert (tmp_path / "without" / "_build" / "html" / "_static" / "book_html_fixes.css").is_file()
