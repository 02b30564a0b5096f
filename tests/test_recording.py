"""A recording is one sitting: its rows carry its id, its manifest hashes its files, and a borrowed, edited or
missing file is found; the sitting records every kind the pages quote."""
import importlib.util
import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from graphbook import paths
from graphbook.measure import environment
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
def clean_repo(tmp_path_factory):
    """A repository with one commit and nothing changed: a sitting records a commit, so it refuses any other."""
    return _committed_repo(tmp_path_factory.mktemp("repo"))


def _committed_repo(folder):
    def git(*args):
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)
    folder.mkdir(parents=True, exist_ok=True)
    git("init", "-q")
    (folder / "README").write_text("a sitting's code\n")
    git("add", "README")
    git("-c", "user.name=test", "-c", "user.email=test@example.invalid", "commit", "-q", "-m", "code")
    return folder


def _sit(steps, root, repo, recording_id, **options):
    return recording.sit(steps, root, fingerprint=MACHINE, scratch=root, recording_id=recording_id, repo=repo,
                         **options)


@pytest.fixture(scope="module")
def sitting(tmp_path_factory, clean_repo):
    root = tmp_path_factory.mktemp("recordings")
    return _sit([_writer("eager"), _writer("fused", exit_status=1)], root, clean_repo, "rec-test")


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_sitting_writes_its_files_and_manifest(sitting, clean_repo):
    manifest = sitting.manifest
    assert [f["kind"] for f in manifest["files"]] == ["fusion-demo", "fusion-demo"]
    assert [c["exit"] for c in manifest["commands"]] == [0, 1]
    assert all(recording.completed(c) for c in manifest["commands"])   # exit 1 with its file: a failed check is data
    assert not recording.completed({"exit": 1, "files": []}) and not recording.completed({"exit": 2, "files": ["x"]})
    assert "cpu-blurball" in manifest["missing_kinds"] and "fusion-demo" not in manifest["missing_kinds"]
    assert manifest["versions"]["torch"] == "2.14.1" and manifest["machine"]["cpu_microarch"] == "Zen 4"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clean_repo, capture_output=True, text=True).stdout.strip()
    (invocation,) = manifest["invocations"]
    assert invocation["commit"] == head and invocation["machine"]["boot_id"] == environment.machine_record()["boot_id"]
    assert {"cpu_flags", "microcode", "memory_gib", "boot_time"} <= set(invocation["machine"])
    assert all(0 <= c["others_cores_mean"] <= c["others_cores_max"] and c["tree_changes"] == []
               and (c["steal_fraction"] is None or 0 <= c["steal_fraction"] < 1) for c in manifest["commands"])
    rows = pd.concat(results.load_file(p) for p in sitting.files("fusion-demo"))
    assert set(rows[results.RECORDING_ID]) == {"rec-test"}
    assert recording.sitting_problems(sitting) == []
    assert recording.disagreements(sitting) == [f"no {k!r} file" for k in recording.PAGE_KINDS if k != "fusion-demo"]


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_recording_is_never_rewritten(sitting, clean_repo):
    with pytest.raises(FileExistsError):
        _sit([], sitting.folder.parent, clean_repo, "rec-test")


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_resumed_sitting_runs_only_what_its_manifest_lacks_and_leaves_every_earlier_line_as_it_was(tmp_path,
                                                                                                  clean_repo):
    first = _sit([_writer("eager")], tmp_path, clean_repo, "rec-r")
    written = first.manifest_path.read_bytes()
    # a command the steps list twice (as the INT8 runs) and the manifest once runs once more
    resumed = _sit([_writer("eager"), _writer("eager"), _writer("fused")], tmp_path, clean_repo, "rec-r", resume=True)
    expected = [_writer(variant).name for variant in ("eager", "eager", "fused")]
    assert [c["command"] for c in resumed.manifest["commands"]] == expected
    assert [c["invocation"] for c in resumed.manifest["commands"]] == [1, 2, 2]
    assert resumed.manifest_path.read_bytes().startswith(written)    # appended, never rewritten
    assert resumed.manifest["files"][0] == first.manifest["files"][0] and len(resumed.manifest["files"]) == 3


@pytest.mark.slow   # git runs as a process
def test_a_sitting_refuses_a_tree_with_changes(tmp_path):
    repo = _committed_repo(tmp_path / "repo")
    (repo / "README").write_text("edited\n")
    with pytest.raises(recording.RecordingError, match="has changes .*README.*commit or stash"):
        _sit([_writer("eager")], tmp_path, repo, "rec-dirty")
    assert not (tmp_path / "rec-dirty").exists()


@pytest.mark.slow   # the sitting runs its commands as processes
def test_a_command_that_changes_the_tree_is_recorded_and_the_recording_refused(tmp_path):
    repo = _committed_repo(tmp_path / "repo")
    done = _sit([Step((sys.executable, "-c", "open('README', 'a').write('more')"))], tmp_path, repo, "rec-writes")
    assert done.manifest["commands"][0]["tree_changes"] == ["README"]
    with pytest.raises(recording.RecordingError, match="changed the repository's tree"):
        recording._open(done.folder)


@pytest.mark.slow   # the sitting runs its commands as processes
def test_each_command_of_a_sitting_compiles_from_an_inductor_cache_of_its_own_empty_at_its_start(tmp_path, clean_repo):
    # exit 0 only where the cache exists and is empty; each command then leaves a compiled file in it
    code = ("import os, sys; d = os.environ['TORCHINDUCTOR_CACHE_DIR']; empty = os.path.isdir(d) and not os.listdir(d); "
            "open(os.path.join(d, 'compiled'), 'w').close(); sys.exit(0 if empty else 4)")
    done = _sit([Step((sys.executable, "-c", code)), Step((sys.executable, "-c", code + " "))], tmp_path, clean_repo,
                "rec-cache")
    assert [c["exit"] for c in done.manifest["commands"]] == [0, 0]
    assert {c["inductor_cache"] for c in done.manifest["commands"]} == {"empty at the command's start"}


def _copy(sitting, tmp_path, edit):
    """The sitting's folder copied, its first file passed through ``edit`` and re-hashed in the manifest (a forgery
    the hashes alone cannot see)."""
    folder = tmp_path / sitting.id
    folder.mkdir()
    for path in sitting.folder.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    name = sitting.manifest["files"][0]["file"]
    edit(folder / name)
    lines = [json.loads(line) for line in (folder / recording.LOG).read_text().splitlines()]
    for entry in (f for line in lines for f in line.get("files", []) if f["file"] == name):
        entry["sha256"] = recording.sha256(folder / name)
    (folder / recording.LOG).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return recording.read(folder)


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


def _invocation(number, *, commit="c0ffee", boot="boot-1", started="2026-12-07T10:00:00+00:00", busy=100.0):
    return {"record": "invocation", "invocation": number, "started": started, "commit": commit,
            "machine": {"boot_id": boot}, "cpu_seconds": {"busy": busy, "steal": 0.0, "total": 1000.0}}


def _command(number, name="code/x.py", *, end="2026-12-07T10:10:00+00:00", busy=160.0, **fields):
    return {"record": "command", "invocation": number, "command": name, "start": "2026-12-07T10:00:00+00:00",
            "end": end, "exit": 0, "tree_changes": [], "cpu_seconds": {"busy": busy}, "files": [], **fields}


def _log(tmp_path, *lines):
    folder = tmp_path / "rec-lines"
    folder.mkdir()
    (folder / recording.LOG).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return recording.read(folder)


@pytest.mark.parametrize("lines, problem", [
    ([_invocation(1), _command(1)], None),
    ([_invocation(1), _command(1), _invocation(2, commit="beef00", started="2026-12-07T10:20:00+00:00", busy=161.0)],
     "invocations at 2 commits"),
    ([_invocation(1), _command(1), _invocation(2, boot="boot-2", started="2026-12-07T10:20:00+00:00", busy=161.0)],
     "invocations on 2 boots"),
    ([_invocation(1, boot="unknown"), _command(1)], "one sitting is one boot"),
    # 600 s between the two invocations: 20 busy seconds is 0.03 cores (idle), 60 is 0.1 (a page or a test ran)
    ([_invocation(1), _command(1), _invocation(2, started="2026-12-07T10:20:00+00:00", busy=180.0), _command(2, "b")],
     None),
    ([_invocation(1), _command(1), _invocation(2, started="2026-12-07T10:20:00+00:00", busy=220.0), _command(2, "b")],
     "between invocations 1 and 2 the machine used 0.10 cores"),
    ([_invocation(1), _command(1), _invocation(2, started="2026-12-07T10:20:00+00:00", busy=161.0), _command(2)],
     "code/x.py: its runs span invocations [1, 2]"),
    ([_invocation(1), _command(1, tree_changes=["code/03_fusion.out.txt"])], "changed the repository's tree"),
    ([_command(1)], "no invocation line"),
])
def test_one_sitting_is_one_commit_one_boot_and_nothing_between_its_invocations(tmp_path, lines, problem):
    found = recording.sitting_problems(_log(tmp_path, *lines))
    assert (found == []) if problem is None else any(problem in p for p in found), found


@pytest.mark.parametrize("command, flags", [
    ({"others_cores_mean": 0.01, "steal_fraction": 0.001}, []),
    ({"others_cores_mean": 0.9, "steal_fraction": 0.001}, ["other processes used 0.90 cores beside it"]),
    ({"others_cores_mean": 0.01, "steal_fraction": 0.08}, ["the host stole 8.0% of the CPU time"]),
    ({}, ["other processes' CPU beside it unknown", "host steal unknown"]),    # missing is unknown, never quiet
])
def test_a_command_is_flagged_for_load_steal_or_what_its_manifest_does_not_say(command, flags):
    assert recording.command_flags(command) == flags


def test_a_reference_whose_manifest_changed_after_it_was_named_is_refused(tmp_path, monkeypatch):
    named = recording.reference()
    copied = tmp_path / named.id
    copied.mkdir()
    (copied / recording.MANIFEST).write_text(named.manifest_path.read_text().replace("AMD EPYC", "AMD EPYC 9R14"))
    (tmp_path / "REFERENCE.txt").write_text(f"{named.id} {recording.reference_line()[1]}\n")
    monkeypatch.setattr(recording, "RECORDINGS_DIR", tmp_path)
    monkeypatch.setattr(recording, "REFERENCE_FILE", tmp_path / "REFERENCE.txt")
    with pytest.raises(recording.RecordingError, match="is not the manifest REFERENCE.txt named"):
        recording.reference()


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


def test_every_run_of_a_command_beside_other_work_or_under_steal_counts_as_under_load(tmp_path):
    rows = [{"run": run, "variant": variant, "median_ms": ms, "q1_ms": ms, "q3_ms": ms}
            for run in (1, 2) for variant, ms in (("eager", 10.0), ("compiled", 5.0))]
    path = results.write_run("cpu-blurball", rows, results_dir=tmp_path, per_run=True)
    quiet = recording._file_entry(tmp_path, path.name, loaded=False)
    loaded = recording._file_entry(tmp_path, path.name, loaded=True)
    assert quiet["runs_under_load"] == [] and loaded["runs_under_load"] == [f"{path.stem}/r1", f"{path.stem}/r2"]
    report = tmp_path / "notes.txt"
    report.write_text("not timed")
    assert recording._file_entry(tmp_path, report.name, loaded=True)["runs_under_load"] is None   # not evaluated
