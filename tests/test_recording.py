"""A recording is one sitting: its rows carry its id, its manifest hashes its files, and a borrowed, edited or
missing file is found; the sitting records every kind the pages quote."""
import importlib.util
import json
import re
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


def _own_findings(sitting, **needed) -> list[str]:
    """What ``disagreements`` finds, but for other work beside the commands: the other pytest worker is that here."""
    return [p for p in recording.disagreements(sitting, **needed) if not p.endswith("beside it")]


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
    assert all(recording.completed(c) for c in manifest["commands"])   # exit 1 with its file: a failed check is data
    assert not recording.completed({"exit": 1, "files": []}) and not recording.completed({"exit": 2, "files": ["x"]})
    assert "cpu-blurball" in manifest["missing_kinds"] and "fusion-demo" not in manifest["missing_kinds"]
    assert manifest["versions"]["torch"] == "2.14.1" and manifest["machine"]["cpu_microarch"] == "Zen 4"
    rows = pd.concat(results.load_file(p) for p in sitting.files("fusion-demo"))
    assert set(rows[results.RECORDING_ID]) == {"rec-test"}
    assert _own_findings(sitting) == [f"no {k!r} file" for k in recording.PAGE_KINDS if k != "fusion-demo"]


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_recording_is_never_rewritten(sitting):
    with pytest.raises(FileExistsError):
        recording.sit([], sitting.folder.parent, fingerprint=MACHINE, scratch=sitting.folder, recording_id="rec-test")
    with pytest.raises(recording.RecordingError, match="written once"):
        recording._write_manifest(sitting.folder, [], MACHINE)


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_resumed_sitting_runs_only_what_its_manifest_lacks(tmp_path):
    first = recording.sit([_writer("eager")], tmp_path, fingerprint=MACHINE, scratch=tmp_path, recording_id="rec-r")
    earlier = first.manifest["files"][0]
    # a command the steps list twice (as the INT8 runs) and the manifest once runs once more
    resumed = recording.sit([_writer("eager"), _writer("eager"), _writer("fused")], tmp_path, fingerprint=MACHINE,
                            scratch=tmp_path, recording_id="rec-r", resume=True)
    expected = [_writer(variant).name for variant in ("eager", "eager", "fused")]
    assert [c["command"] for c in resumed.manifest["commands"]] == expected
    assert resumed.manifest["files"][0] == earlier and len(resumed.manifest["files"]) == 3
    assert _own_findings(resumed, needed=()) == []


@pytest.mark.slow   # the sitting runs its commands as processes
def test_each_command_of_a_sitting_compiles_from_an_inductor_cache_of_its_own_empty_at_its_start(tmp_path):
    # exit 0 only where the cache exists and is empty; each command then leaves a compiled file in it
    code = ("import os, sys; d = os.environ['TORCHINDUCTOR_CACHE_DIR']; empty = os.path.isdir(d) and not os.listdir(d); "
            "open(os.path.join(d, 'compiled'), 'w').close(); sys.exit(0 if empty else 4)")
    done = recording.sit([Step((sys.executable, "-c", code)), Step((sys.executable, "-c", code + " "))], tmp_path,
                         fingerprint=MACHINE, scratch=tmp_path, recording_id="rec-cache")
    assert [c["exit"] for c in done.manifest["commands"]] == [0, 0]
    assert {c["inductor_cache"] for c in done.manifest["commands"]} == {"empty at the command's start"}


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
def test_a_file_changed_after_the_sitting_or_a_command_beside_other_work_is_found(sitting, tmp_path):
    assert all(0 <= c["others_cores_mean"] <= c["others_cores_max"] for c in sitting.manifest["commands"])
    copied = _copy(sitting, tmp_path, lambda path: None)
    (copied.folder / copied.manifest["files"][1]["file"]).write_text("variant\nforged\n")
    manifest = json.loads((copied.folder / recording.MANIFEST).read_text())
    manifest["commands"][0]["others_cores_mean"], manifest["commands"][1]["others_cores_mean"] = 1.5, 0.0
    (copied.folder / recording.MANIFEST).write_text(json.dumps(manifest))
    assert recording.disagreements(recording._open(copied.folder), needed=()) == [
        f"{manifest['commands'][0]['command']}: other processes used 1.50 cores beside it",
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


#: Kinds a page may read outside the reference recording, each with the reason.
OUTSIDE_THE_RECORDING = {
    "gpu-blurball": "the lab's GPU runs (README's lab steps): a CPU sitting records no GPU",
    "gpu-tensorrt": "the lab's GPU runs (README's lab steps): a CPU sitting records no GPU",
    "notebook-executions": "the log of the pages' own executions, not a measurement",
}
_LOAD = re.compile(r"results\.(?:load|files)\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)")


def _sources():
    """Every page's code and every package module, by name."""
    for path in sorted([*(paths.REPO_ROOT / "chapters").glob("*.ipynb"), *(paths.REPO_ROOT / "appendix").glob("*.ipynb")]):
        cells = json.loads(path.read_text())["cells"]
        yield path.name, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for path in sorted((paths.CODE_DIR / "graphbook").rglob("*.py")):
        if path.name not in ("results.py", "recording.py"):   # the readers themselves
            yield str(path.relative_to(paths.CODE_DIR)), path.read_text()


def _reads_outside_the_recording(name, text):
    """Each read of a results folder in ``text`` that does not go through the reference recording's loader: a
    ``results.load`` or ``results.files`` of the default folder (one argument) for a kind not exempt, and any
    ``read_csv`` or glob of ``RESULTS_DIR``."""
    found = []
    for call in _LOAD.finditer(text):
        args = [a.strip() for a in call.group("args").split(",") if a.strip()]
        kind = args[0].strip("\"'") if args else ""
        if len(args) == 1 and kind not in OUTSIDE_THE_RECORDING:
            found.append(f"{name}: {call.group(0)}")
    found += [f"{name}: {line.strip()}" for line in text.splitlines()
              if "RESULTS_DIR" in line and ("read_csv" in line or "glob" in line or "iterdir" in line)]
    return found


def test_pages_read_recorded_figures_only_from_the_reference_recording():
    offenders = [hit for name, text in _sources() for hit in _reads_outside_the_recording(name, text)]
    assert not offenders, offenders


@pytest.mark.parametrize("text, caught", [
    ('frame = results.load("cpu-blurball")', True),                       # the default folder, a page kind
    ("frame = results.load(kind)", True),
    ('frame = results.load("gpu-blurball")', False),                      # the lab's, exempt by name
    ('frame = results.load("your-model", work)', False),                  # a folder the page just wrote
    ('for p in paths.RESULTS_DIR.glob("*.csv"): pd.read_csv(p)', True),
    ('frame = recording.load("cpu-blurball")', False),
])
def test_the_scan_catches_a_read_around_the_loader(text, caught):
    assert bool(_reads_outside_the_recording("page", text)) == caught


def test_every_history_file_is_named_with_its_reason():
    listed = (recording.HISTORY_DIR / "README.md").read_text()
    kept = sorted(p.name for p in recording.HISTORY_DIR.glob("*.csv"))
    assert kept and [name for name in kept if f"`{name}`" not in listed] == []


def test_the_reference_recording_is_whole_and_its_rows_are_its_own():
    reference = recording.reference()
    assert recording.disagreements(reference) == []
    assert reference.manifest["missing_kinds"] == []
    assert all(recording.completed(command) for command in reference.manifest["commands"])


def test_a_sittings_measurement_is_counted_once_per_compile_and_never_exceeds_a_commands_wall(script):
    floor = script("scripts/sitting_floor.py")
    runs = pd.DataFrame({"variant": ["a", "a", "a", "b"], "compile_s": [20.0, 20.0, 20.0, 5.0],
                         "median_ms": [100.0] * 4, "repeats": [10] * 4, "warmup": [2] * 4})
    assert floor.measured_seconds(runs) == {"timed calls": pytest.approx(4.8), "cold compiles": 25.0}
    table = floor.floor(recording.reference())
    assert (table["measured_min"] <= table["wall_min"]).all(), table[["command", "wall_min", "measured_min"]]
    assert table["measured_min"].sum() > 0.5 * table["wall_min"].sum()
