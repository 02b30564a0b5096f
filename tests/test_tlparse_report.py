"""The committed tlparse report of BlurBall's compile (Chapter 3; ``code/make_tlparse_report.py`` makes it): present,
published where Chapter 3 links it, made by the pinned torch and tlparse."""
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


def test_the_report_is_committed_with_provenance_of_the_pinned_torch_and_tlparse_and_a_missing_one_explained(tmp_path):
    record = d.tlparse_provenance()
    for key in ("torch", "tlparse", "cpu", "cpu_capability", "date_utc", "command", "input_shape", "seconds"):
        assert record.get(key) not in (None, ""), key
    assert record["url"] == "tlparse/index.html"
    assert record["command"].startswith("python code/make_tlparse_report.py")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date_utc"])
    assert record["torch"].split("+")[0] == _pinned("torch"), (
        f"the tlparse report was made with torch {record['torch']}, requirements.txt pins {_pinned('torch')}: "
        "rerun python code/make_tlparse_report.py and commit images/extra/tlparse")
    assert record["tlparse"] == _pinned("tlparse")
    with pytest.raises(FileNotFoundError, match="make_tlparse_report.py"):
        d.tlparse_provenance(tmp_path)
    (tmp_path / "index.html").write_text("<html></html>")
    (tmp_path / "provenance.json").write_text('{"torch": "1.0.0+cpu"}')
    assert d.tlparse_provenance(tmp_path)["same_torch"] is False


def test_the_book_publishes_the_report_where_chapter_3_links_it_small_and_with_links_that_resolve():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    extra = [ROOT / p for p in config["sphinx"]["config"]["html_extra_path"]]
    source = next(p for p in extra if d.TLPARSE_REPORT_DIR.is_relative_to(p))
    # html_extra_path copies the folder's contents to the site root
    assert (d.TLPARSE_REPORT_DIR / "index.html").relative_to(source).as_posix() == d.TLPARSE_SITE_PATH
    # the report is not ignored by git (it is committed, not built)
    assert "tlparse" not in (ROOT / ".gitignore").read_text()
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


def test_fix_tlparse_pages_mends_the_dead_link_and_the_script_error_and_the_committed_report_is_mended(tmp_path):
    page = ('<p>\nBuild products below:\n</p>\n<p>\n<a href="collectives_parity.json">Collectives Parity report</a>'
            ' comparing scheduler and Inductor output code collective operations.\n</p>\n<p>\nnext\n</p>\n'
            "<script>if (queryParams.size === 0) return url; // No query params</script>")
    (tmp_path / "index.html").write_text(page)
    assert d._fix_tlparse_pages(tmp_path) == 1 and d._fix_tlparse_pages(tmp_path) == 0
    assert (tmp_path / "index.html").read_text() == ("<p>\nBuild products below:\n</p>\n<p>\nnext\n</p>\n"
                                                     "<script>if (queryParams.size === 0) return; // No query params</script>")
    for page in d.TLPARSE_REPORT_DIR.rglob("*.html"):
        assert d._UNDEFINED_RETURN not in page.read_text(), page
