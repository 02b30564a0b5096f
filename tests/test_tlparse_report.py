"""The committed tlparse report of BlurBall's compile (Chapter 3): present, published, made by the pinned torch.

The report is generated once by ``code/make_tlparse_report.py`` and committed under ``images/extra/tlparse/``
(a cold compile takes minutes; the test command must stay fast). These tests fail when it is missing, when
the book would not publish it at the URL Chapter 3 links, or when it was made with another torch (or
tlparse) release than requirements.txt pins -- then rerun the script and commit the folder.
"""
import re
from urllib.parse import unquote, urljoin, urlparse

import pytest
import yaml

from graphbook import paths
from graphbook.teach import diagnostics as d

ROOT = paths.REPO_ROOT


def _pinned(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==([^\s;#]+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert match, f"{name} is not pinned in requirements.txt"
    return match.group(1)


def test_the_report_is_committed_with_its_provenance():
    record = d.tlparse_provenance()
    for key in ("torch", "tlparse", "cpu", "cpu_capability", "date_utc", "command", "input_shape", "seconds"):
        assert record.get(key) not in (None, ""), key
    assert record["url"] == "tlparse/index.html"
    assert record["command"].startswith("python code/make_tlparse_report.py")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date_utc"])


def test_the_report_was_made_with_the_pinned_torch_and_tlparse():
    record = d.tlparse_provenance()
    assert record["torch"].split("+")[0] == _pinned("torch"), (
        f"the tlparse report was made with torch {record['torch']}, requirements.txt pins {_pinned('torch')}: "
        "rerun python code/make_tlparse_report.py and commit images/extra/tlparse")
    assert record["tlparse"] == _pinned("tlparse")


def test_the_book_publishes_the_report_where_chapter_3_links_it():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    extra = [ROOT / p for p in config["sphinx"]["config"]["html_extra_path"]]
    source = next(p for p in extra if d.TLPARSE_REPORT_DIR.is_relative_to(p))
    # html_extra_path copies the folder's contents to the site root
    assert (d.TLPARSE_REPORT_DIR / "index.html").relative_to(source).as_posix() == d.TLPARSE_SITE_PATH
    # the report is not ignored by git (it is committed, not built)
    assert "tlparse" not in (ROOT / ".gitignore").read_text()


def test_the_report_is_small_and_its_links_resolve():
    folder = d.TLPARSE_REPORT_DIR
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert not (folder / "raw.log").exists() and not (folder / "raw.jsonl").exists()
    assert sum(p.stat().st_size for p in files) < 10e6
    site = "http://report.invalid/"
    for page in folder.rglob("*.html"):
        text = page.read_text(errors="replace")
        page_url = urljoin(site, page.relative_to(folder).as_posix())
        base = re.search(r'<base href=["\']([^"\']*)["\']', text)  # tlparse's sub-pages use <base href="..">
        base_url = urljoin(page_url, base.group(1).rstrip("/") + "/") if base else page_url
        for href in re.findall(r'<a [^>]*href=["\']([^"\']+)["\']', text):
            url = urlparse(urljoin(base_url, href))
            if not url.geturl().startswith(site) or href.startswith("#"):
                continue  # the web (Perfetto's viewer) is not the report's
            target = folder / unquote(url.path[len("/"):])
            assert target.exists(), f"{page.relative_to(folder)} links {href!r}, missing"


def test_provenance_of_a_missing_report_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_tlparse_report.py"):
        d.tlparse_provenance(tmp_path)


def test_provenance_compares_the_torch_release(tmp_path):
    (tmp_path / "index.html").write_text("<html></html>")
    (tmp_path / "provenance.json").write_text('{"torch": "1.0.0+cpu"}')
    assert d.tlparse_provenance(tmp_path)["same_torch"] is False


def test_fix_tlparse_pages_mends_the_dead_link_and_the_script_error(tmp_path):
    page = ('<p>\nBuild products below:\n</p>\n<p>\n<a href="collectives_parity.json">Collectives Parity report</a>'
            ' comparing scheduler and Inductor output code collective operations.\n</p>\n<p>\nnext\n</p>\n'
            "<script>if (queryParams.size === 0) return url; // No query params</script>")
    (tmp_path / "index.html").write_text(page)
    assert d._fix_tlparse_pages(tmp_path) == 1 and d._fix_tlparse_pages(tmp_path) == 0
    assert (tmp_path / "index.html").read_text() == ("<p>\nBuild products below:\n</p>\n<p>\nnext\n</p>\n"
                                                     "<script>if (queryParams.size === 0) return; // No query params</script>")


def test_the_committed_report_is_mended():
    for page in d.TLPARSE_REPORT_DIR.rglob("*.html"):
        assert d._UNDEFINED_RETURN not in page.read_text(), page
