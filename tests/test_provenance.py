"""The provenance helpers read what the executor and the chapters stored in a notebook."""
import json

import pytest

from graphbook.pages import provenance


def _write(path, cells, execution=None):
    meta = {"kernelspec": {"name": "python3"}}
    if execution:
        meta["graphbook"] = {"execution": execution}
    path.write_text(json.dumps({"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _glue_output(name, text):
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}},
            "data": {"application/papermill.record/text/plain": text}}


def test_chapter_table_reads_execution_records_and_glued_status_and_refuses_an_unreadable_notebook(tmp_path):
    (tmp_path / "chapters").mkdir()
    _write(tmp_path / "chapters" / "01_a.ipynb",
           [{"cell_type": "markdown", "source": "# First chapter", "metadata": {}},
            {"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1,
             "outputs": [_glue_output("gpu_status", "'Live GPU measurement skipped: no CUDA.'"),
                         _glue_output("results_shown", "'cpu_fusion_demo.csv'")]}],
           execution={"executed_at": "2026-11-29T09:00:00+00:00", "seconds": 42.0, "code_cells": 1})
    _write(tmp_path / "chapters" / "02_b.ipynb", [{"cell_type": "markdown", "source": "# Second", "metadata": {}}])
    table = provenance.chapter_table(tmp_path)
    assert table["chapter"].tolist() == ["First chapter", "Second"]
    first, second = table.iloc[0], table.iloc[1]
    assert first["seconds"] == 42.0 and first["gpu_part"] == "Live GPU measurement skipped: no CUDA."
    assert first["results_shown"] == "cpu_fusion_demo.csv"
    assert second["executed_at"].startswith("never") and second["gpu_part"] == "no GPU part"
    (tmp_path / "chapters" / "bad.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match="bad.ipynb: not a readable notebook"):
        provenance.chapter_table(tmp_path)


def test_the_execution_log_and_the_chapter_table_name_machines_by_fingerprint(tmp_path):
    import csv

    from graphbook import paths

    with open(paths.RESULTS_DIR / "notebook_executions.csv", newline="") as log:
        rows = list(csv.reader(log))
    assert rows[0].count("notebook") == 1 and {"cpu_family", "cpu_model_id", "cpu_ghz"} <= set(rows[0])
    assert rows[0] not in rows[1:], "a second header row inside the log"
    (tmp_path / "chapters").mkdir()
    (tmp_path / "appendix").mkdir()
    record = {"executed_at": "2026-12-03T16:00:00+00:00", "seconds": 10.0, "code_cells": 3,
              "cpu_model": "AMD EPYC", "cpu_family": 26, "cpu_model_id": 2, "cpu_microarch": "Zen 5",
              "cpu_isa": "avx512_vnni", "cpu_ghz": 3.9}
    _write(tmp_path / "chapters" / "01_x.ipynb", [{"cell_type": "markdown", "source": "# X", "metadata": {}}], record)
    machine = provenance.chapter_table(tmp_path)["machine"].iloc[0]
    assert machine == "AMD EPYC (Zen 5, family 26 model 2, avx512_vnni, 3.9 GHz measured)"
