"""A recording's verifier, as MLPerf's submission checker is for its results: it proves from the recording's own
files what its manifest says, or names what it cannot prove. Each finding is one fact, its file and its check:
the plan the commands ran, the commit behind every row, every hash, every statistic recomputed from its readings,
the controls (quiet commands, the planted fault rejected, the A/A pair not called faster) and one sitting."""
from __future__ import annotations

import collections
import importlib.util
import inspect
import math
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from graphbook import paths
from graphbook.measure.summaries import percentiles, summary
from graphbook.record import recording as rec
from graphbook.record import results

#: The script whose ``steps(scratch, plan)`` lists a sitting's commands, read at the recording's own commit.
PLAN_SCRIPT = "scripts/record_sitting.py"
#: The copy of the reference in a timed comparison: a verdict that calls it faster than the reference is noise.
AA_VARIANT = "eager_again"


@dataclass(frozen=True)
class Finding:
    """What the verifier could not prove: the file (or the manifest), the check, and the fact."""

    file: str
    check: str
    detail: str


def verify(recording: rec.Recording, *, repo: str | Path = paths.REPO_ROOT,
           reference_file: str | Path | None = None) -> list[Finding]:
    """Every check on ``recording``; an empty list: it proves what its manifest says. ``repo`` is the repository
    whose history holds its commit; ``reference_file`` the REFERENCE.txt that names it (default: the one beside it)."""
    repo = Path(repo)
    manifest = recording.manifest_path.name
    findings = [Finding(manifest, "sitting", problem) for problem in rec.sitting_problems(recording)]
    if recording.predates_checks:
        findings.append(Finding(manifest, "sitting", "predates the append-only manifest: one commit, one boot and "
                                                     "one invocation cannot be proved"))
    commit, plan = _commit_and_plan(recording)
    findings += _commit_checks(recording, commit, repo, manifest)
    findings += _plan_checks(recording, commit, plan, repo, manifest)
    findings += _hash_checks(recording, Path(reference_file) if reference_file else
                             recording.folder.parent / rec.REFERENCE_FILE.name)
    findings += _statistic_checks(recording)
    findings += _control_checks(recording)
    return findings


def _commit_and_plan(recording: rec.Recording) -> tuple[str, str]:
    if recording.predates_checks:
        return recording.manifest.get("commit", rec.UNKNOWN), "book"
    first = recording.manifest["invocations"][0] if recording.manifest["invocations"] else {}
    return first.get("commit", rec.UNKNOWN), first.get("plan", "book")


def _commit_checks(recording: rec.Recording, commit: str, repo: Path, manifest: str) -> list[Finding]:
    findings = []
    if commit.endswith("+dirty"):
        findings.append(Finding(manifest, "commit", f"{commit}: uncommitted changes, so the code is not a commit"))
    bare = commit.removesuffix("+dirty")
    try:
        rec.git(repo, "merge-base", "--is-ancestor", bare, "HEAD")
    except rec.RecordingError:
        findings.append(Finding(manifest, "commit", f"{bare[:12]} is not an ancestor of HEAD in {repo}"))
    for entry in _result_files(recording):
        frame = pd.read_csv(recording.folder / entry["file"], dtype=str, keep_default_na=False)
        if "git_commit" not in frame:
            continue
        others = sorted(c for c in set(frame["git_commit"]) if not (c and not c.endswith("+dirty")
                                                                     and bare.startswith(c)))
        if others:
            findings.append(Finding(entry["file"], "commit", f"rows at {', '.join(others)}, not {bare[:12]}"))
    return findings


def _result_files(recording: rec.Recording) -> list[dict]:
    return [e for e in recording.manifest["files"] if e["kind"] in results.KINDS
            and (recording.folder / e["file"]).is_file()]


def _plan_checks(recording: rec.Recording, commit: str, plan: str, repo: Path, manifest: str) -> list[Finding]:
    """The manifest's commands against the plan's at the commit: each command as often as the plan lists it."""
    try:
        planned = _plan_at(commit.removesuffix("+dirty"), plan, repo)
    except (rec.RecordingError, RuntimeError, SyntaxError, ImportError, AttributeError, TypeError) as error:
        return [Finding(manifest, "commands", f"cannot read plan {plan!r} at {commit[:12]}: {error}")]
    ran = collections.Counter(c["command"] for c in recording.manifest["commands"])
    listed = collections.Counter(planned)
    findings = [Finding(manifest, "commands", f"recorded {ran[c]} times, plan {plan!r} lists it {listed[c]} "
                                              f"times: {c}") for c in ran if c in listed and ran[c] > listed[c]]
    findings += [Finding(manifest, "commands", f"not in plan {plan!r} at {commit[:12]}: {c}") for c in ran
                 if c not in listed]
    findings += [Finding(manifest, "commands", f"recorded {ran[c]} of the {listed[c]} times plan {plan!r} lists: {c}")
                 for c in listed if ran[c] < listed[c]]
    return findings


def _plan_at(commit: str, plan: str, repo: str | Path = paths.REPO_ROOT) -> list[str]:
    """The commands of ``plan`` in :data:`PLAN_SCRIPT` as it was at ``commit``, named as a manifest names them."""
    shown = rec.git(repo, "show", f"{commit}:{PLAN_SCRIPT}")
    with tempfile.TemporaryDirectory(prefix="plan-") as folder:
        script = Path(folder) / "record_sitting_at_commit.py"
        script.write_text(shown)
        spec = importlib.util.spec_from_file_location("record_sitting_at_commit", script)
        module = importlib.util.module_from_spec(spec)
        with warnings.catch_warnings():   # its imports' tqdm warns, in a notebook, that it has no progress widget
            warnings.filterwarnings("ignore", message="IProgress not found")
            spec.loader.exec_module(module)
    scratch = Path("<scratch>")
    takes_plan = "plan" in inspect.signature(module.steps).parameters
    if not takes_plan and plan != "book":
        raise RuntimeError(f"its steps() knows no plan {plan!r}")
    steps = module.steps(scratch, plan) if takes_plan else module.steps(scratch)
    return [step.name for step in steps]


def _hash_checks(recording: rec.Recording, reference_file: Path) -> list[Finding]:
    listed = {e["file"] for e in recording.manifest["files"]}
    findings = [Finding(e["file"], "sha256", "missing, or not the file the manifest hashed")
                for e in recording.manifest["files"] if not (recording.folder / e["file"]).is_file()
                or rec.sha256(recording.folder / e["file"]) != e["sha256"]]
    on_disk = {p.relative_to(recording.folder).as_posix() for p in recording.folder.rglob("*") if p.is_file()}
    findings += [Finding(name, "sha256", "in the recording's folder, not hashed by its manifest")
                 for name in sorted(on_disk - listed - {rec.LOG, rec.MANIFEST})]
    manifest = recording.manifest_path.name
    if not reference_file.is_file():
        return findings + [Finding(manifest, "reference", f"no {reference_file} to name its sha256")]
    named, digest = rec.reference_line(reference_file)
    if named != recording.id:
        findings.append(Finding(manifest, "reference", f"{reference_file.name} names {named}, not this recording"))
    elif digest != rec.sha256(recording.manifest_path):
        findings.append(Finding(manifest, "reference", f"its sha256 is not the {digest[:12] or 'none'} that "
                                                       f"{reference_file.name} names"))
    return findings


def _statistic_checks(recording: rec.Recording) -> list[Finding]:
    """Every timed series' statistics (:func:`timed_series`) recomputed from its readings; a timed file without
    readings said so."""
    findings = []
    hashed = {e["file"] for e in recording.manifest["files"]}
    for entry in _result_files(recording):
        path = recording.folder / entry["file"]
        frame = pd.read_csv(path)
        series = {prefix: columns for prefix, columns in timed_series(frame).items()
                  if frame[next(iter(columns.values()))].notna().any()}
        if not series:
            continue
        readings = results.raw_times(path)
        if readings is None:
            timed = frame[[next(iter(c.values())) for c in series.values()]].notna().any(axis=1).sum()
            findings.append(Finding(entry["file"], "raw times", f"{timed} timed rows and no readings: "
                                                                "no statistic can be recomputed"))
            continue
        if results.raw_times_path(path).name not in hashed:
            findings.append(Finding(results.raw_times_path(path).name, "raw times", "not hashed by the manifest"))
        kept = {key: group.sort_values("reading")["ms"].tolist()
                for key, group in readings.groupby(["row", "series"])}
        for prefix, columns in series.items():
            timed = frame.index[frame[next(iter(columns.values()))].notna()]
            missing = [row for row in timed if (row, prefix) not in kept]
            if missing:
                findings.append(Finding(entry["file"], "raw times", f"{len(missing)} timed rows without "
                                                                    f"{prefix}readings (rows {missing[:5]})"))
            for row in (r for r in timed if (r, prefix) in kept):
                again = {**summary(kept[row, prefix]), **percentiles(kept[row, prefix])}
                findings += [Finding(entry["file"], "raw times", f"row {row}: {column} {frame.at[row, column]} "
                                     f"recorded, {again[statistic]} from its {len(kept[row, prefix])} readings")
                             for statistic, column in columns.items() if not pd.isna(frame.at[row, column])
                             and not math.isclose(float(frame.at[row, column]), float(again[statistic]),
                                                  rel_tol=1e-9, abs_tol=1e-12)]
    return findings


def timed_series(frame: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Each series of readings a results file summarizes, by its prefix, with the column of each statistic it
    records (the median first): a timed call's (:func:`graphbook.measure.timing.summary`), a median
    (``<prefix>median_ms``, or ``<prefix>ms`` as the INT8 matrix's ``latency_ms``) beside the readings' spread
    (``<prefix>min_ms`` or ``<prefix>q1_ms``); a load test's (:func:`graphbook.measure.timing.percentiles`),
    ``<prefix>p50_ms`` and its fellows. A median of other rows' medians (a verdict's ``best_median_ms``) has no
    spread beside it and no readings of its own."""
    columns, found = set(frame.columns), {}
    for prefix in {c.removesuffix(spread) for c in columns for spread in ("min_ms", "q1_ms") if c.endswith(spread)}:
        median = (prefix + "median_ms" if prefix + "median_ms" in columns
                  else prefix + "ms" if prefix and prefix + "ms" in columns else None)
        if median is not None:
            found[prefix] = {"median_ms": median, **{s: prefix + s for s in ("min_ms", "max_ms", "q1_ms", "q3_ms")
                                                     if prefix + s in columns},
                             **({"repeats": "repeats"} if not prefix and "repeats" in columns else {})}
    for prefix in {c.removesuffix("p50_ms") for c in columns if c.endswith("p50_ms")}:
        found[prefix] = {s: prefix + s for s in ("p50_ms", "p90_ms", "p99_ms", "max_ms") if prefix + s in columns}
    return found


def _control_checks(recording: rec.Recording) -> list[Finding]:
    """Quiet commands (load and steal within their limits, unknown counted against), the planted fault rejected in
    every run that plants one, and no A/A pair called faster."""
    manifest = recording.manifest_path.name
    timed_commands = {e["command"] for e in _result_files(recording)
                      if "median_ms" in pd.read_csv(recording.folder / e["file"], nrows=0).columns}
    findings = [Finding(manifest, "controls", f"{c['command']}: {flag}") for c in recording.manifest["commands"]
                if c["command"] in timed_commands for flag in rec.command_flags(c)]
    for entry in _result_files(recording):
        frame = pd.read_csv(recording.folder / entry["file"], dtype=str, keep_default_na=False)
        if entry["kind"] == "your-model":
            faults = frame[frame.get("record", pd.Series(dtype=str)) == "fault"]
            if faults.empty:
                findings.append(Finding(entry["file"], "controls", "no planted fault: the check was never shown "
                                                                   "able to fail"))
            elif not (faults["rejected"] == "True").all():
                findings.append(Finding(entry["file"], "controls", "the planted fault was not rejected"))
        if {"outcome", "best", "runner_up"} <= set(frame.columns):
            pairs = frame[(frame["outcome"] == "faster") & ((frame["best"] == AA_VARIANT)
                                                            | (frame["runner_up"] == AA_VARIANT))]
            findings += [Finding(entry["file"], "controls", f"the A/A pair was called faster ({row.best} over "
                                                            f"{row.runner_up})") for row in pairs.itertuples()]
    return findings
