"""The code a chapter teaches is the code the package runs: every ``#@save`` cell equals its block in graphbook."""
import json
import shutil

import pytest

from graphbook.paths import REPO_ROOT
from graphbook.pages import page_export


def test_every_taught_block_equals_its_page_and_the_pages_teach_the_book_s_algorithms():
    stale = page_export.stale_modules(page_export.pages())
    assert not stale, f"run scripts/export_taught_code.py: {[str(p.relative_to(REPO_ROOT)) for p in stale]} differ"
    saved = {module for page in page_export.pages() for module in page_export._taught_cells(page)}
    assert {"method.folding", "teach.fusion_demo", "teach.fusion_rules", "teach.attribution", "freezing.minimizer"} <= saved


@pytest.fixture
def checkout_copy(tmp_path):
    """The pages and the package's modules in a scratch folder, so a test can change one character."""
    for folder in (*page_export.PAGE_DIRS, "code/graphbook"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return tmp_path


def test_one_character_changed_on_a_page_is_caught_and_a_block_whose_page_saves_nothing_is_refused(checkout_copy):
    page = checkout_copy / "chapters" / "01_chef_and_refrigerator.ipynb"
    notebook = json.loads(page.read_text())
    cell = next(c for c in notebook["cells"] if "".join(c["source"]).startswith("#@save method.folding"))
    cell["source"] = "".join(cell["source"]).replace("torch.sqrt(var + bn.eps)", "torch.sqrt(var + bn.eps*2)", 1)
    page.write_text(json.dumps(notebook))
    package = checkout_copy / "code" / "graphbook"
    stale = page_export.stale_modules(page_export.pages(checkout_copy), checkout_copy, package)
    assert stale == [package / "method" / "folding.py"]
    package = checkout_copy / "code" / "graphbook"
    orphan = package / "model" / "scoring.py"
    orphan.write_text(orphan.read_text() + "# >>> taught on chapters/99_gone.ipynb: edit it there\n")
    with pytest.raises(ValueError, match="saves nothing"):
        page_export.exported_modules(page_export.pages(checkout_copy), checkout_copy, package)
