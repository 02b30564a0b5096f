"""A recording is one sitting: its rows carry its id, its manifest hashes its files, and a borrowed, edited or
missing file is found; the sitting records every kind the pages quote."""
import importlib.util
import json
import sys

import pandas as pd
import pytest
from graphbook import paths
from graphbook.record import recording, results
from graphbook.record.recording import Step

MACHINE = {"cpu_model": "Test CPU", "cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_id": 17,
           "cpu_microarch": "Zen 4", "cpu_isa": "avx512_vnni", "torch": "2.14.1", "git_commit": "abc", "python": "3.11"}


def _writer(variant: str, exit_status: int = 0) -> Step:
    """A command that writes one fusion-demo row as a benchmark would, then exits with ``exit_status``."""
    row = {"variant": variant, "median_ms": 1.0, **{k: MACHINE[k] for k in recording.IDENTITY}}
    code = (f"import sys; from graphbook.record import results; results.write_run('fusion-demo', [{row!r}]); "
            f"sys.exit({exit_status})")
    return Step((sys.executable, "-c", code))


@pytest.fixture(scope="module")
def sitting(tmp_path_factory):
    root = tmp_path_factory.mktemp("recordings")
    return recording.sit([_writer("eager"), _writer("fused", exit_status=1)], root, fingerprint=MACHINE,
                         scratch=root, recording_id="rec-test")


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_sitting_writes_its_files_and_manifest(sitting):
    manifest = json.loads((sitting.folder / recording.MANIFEST).read_text())
    assert [f["kind"] for f in manifest["files"]] == ["fusion-demo", "fusion-demo"]
    assert [c["exit"] for c in manifest["commands"]] == [0, 1]
    assert "cpu-blurball" in manifest["missing_kinds"] and "fusion-demo" not in manifest["missing_kinds"]
    assert manifest["versions"]["torch"] == "2.14.1" and manifest["machine"]["cpu_microarch"] == "Zen 4"
    rows = pd.concat(results.load_file(p) for p in sitting.files("fusion-demo"))
    assert set(rows[results.RECORDING_ID]) == {"rec-test"}
    assert recording.disagreements(sitting, needed=("fusion-demo",)) == []
    assert recording.disagreements(sitting) == [f"no {k!r} file" for k in recording.PAGE_KINDS if k != "fusion-demo"]


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_recording_is_never_rewritten(sitting):
    with pytest.raises(FileExistsError):
        recording.sit([], sitting.folder.parent, fingerprint=MACHINE, scratch=sitting.folder, recording_id="rec-test")
    with pytest.raises(recording.RecordingError, match="written once"):
        recording._write_manifest(sitting.folder, [], MACHINE)


def _copy(sitting, tmp_path, edit):
    """The sitting's folder copied, its first file passed through ``edit`` and re-hashed in the manifest."""
    folder = tmp_path / sitting.id
    folder.mkdir()
    for path in sitting.folder.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    first = folder / sitting.manifest["files"][0]["file"]
    edit(first)
    manifest = json.loads((folder / recording.MANIFEST).read_text())
    manifest["files"][0]["sha256"] = recording.sha256(first)
    (folder / recording.MANIFEST).write_text(json.dumps(manifest))
    return recording._open(folder)


def _edit_column(column, value):
    def edit(path):
        frame = pd.read_csv(path, dtype=str)
        frame[column] = value
        frame.to_csv(path, index=False)
    return edit


@pytest.mark.slow   # the sitting runs its commands as processes
@pytest.mark.parametrize("column, value, found", [
    (results.RECORDING_ID, "rec-elsewhere", "recording ids ['rec-elsewhere']"),   # rows borrowed from another sitting
    ("cpu_microarch", "Zen 5", "cpu_microarch ['Zen 5'], not Zen 4"),            # another machine's rows
    ("torch", "2.13.0", "torch ['2.13.0'], not 2.14.1"),
])
def test_rows_that_are_not_the_sittings_are_found(sitting, tmp_path, column, value, found):
    copied = _copy(sitting, tmp_path, _edit_column(column, value))
    assert any(found in problem for problem in recording.disagreements(copied, needed=()))


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_file_changed_after_the_sitting_is_found(sitting, tmp_path):
    copied = _copy(sitting, tmp_path, lambda path: None)
    (copied.folder / copied.manifest["files"][1]["file"]).write_text("variant\nforged\n")
    assert recording.disagreements(copied, needed=()) == [
        f"{copied.manifest['files'][1]['file']}: missing or not the file the manifest hashed"]


def _sitting_script():
    spec = importlib.util.spec_from_file_location("record_sitting", paths.REPO_ROOT / "scripts" / "record_sitting.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sitting_records_every_kind_a_page_quotes(tmp_path):
    commands = [step.name for step in _sitting_script().steps(tmp_path)]
    recorded = {k.name for k in results.KINDS.values() if any(c.startswith(k.script) for c in commands)}
    assert set(recording.PAGE_KINDS) <= recorded, set(recording.PAGE_KINDS) - recorded
    assert sum(c == "code/bench_int8.py" for c in commands) >= 3   # one timed run per call


def test_bad_arguments_exit_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        _sitting_script().main(["--recordings-dir", "/proc/version/x"])
    assert stopped.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
