"""The result files in ``data/results/``: kinds, file names, column names and read-back. Files are append-only
(every run writes a new file), so a recorded number can always be traced to the run that made it."""
from __future__ import annotations

import csv
import datetime as _dt
import gzip
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

from graphbook import paths
from graphbook.record.cli import EXIT_CHECK_FAILED, EXIT_OK

RECORDING_ENV = "GRAPHBOOK_RECORDING"  #: set during a sitting (scripts/run_benchmarks.sh): every row written carries it
RECORDING_ID = "recording_id"      #: the sitting a row was recorded in (graphbook.record.recording)
RUN_ID = "run_id"                  #: one id per recorded run (a file written by write_run is one run)
SOURCE_FILE = "source_file"        #: added on read: the file a row came from
RUN = "run"                        #: 1, 2, 3...: the run of its recording (file) a row belongs to;
                                   #: write_run(per_run=True) makes its run_id "<file stem>/r<run>"
RUN_ORDER = "run_order"            #: 1 = the variant went first in its run (the order rotates between runs)
COPY_GBPS = "copy_gbps"            #: copy_ bandwidth measured in the same run (graphbook.record.runs.flag_under_load)
DATE = "date"                      #: UTC ISO 8601 time of the run (environment fingerprint)
VARIANT = "variant"                #: a variant name (see graphbook.method.variants for BlurBall's)
MEDIAN_MS = "median_ms"
MAX_ABS_DIFF = "max_abs_diff"      #: largest |output - eager FP32 output|
RELATIVE_DIFF = "relative_diff"    #: max_abs_diff / max(1, largest |reference|)
SAME_OUTPUT = "same_output"        #: bool: max_abs_diff within SAME_OUTPUT_ATOL (relative to scale)
SAME_PEAKS = "same_peaks"          #: bool: every frame's heatmap peak in the same pixel as eager
SAME_PEAK_FRAMES = "same_peak_frames"  #: frames whose heatmap peak is in eager's pixel
PEAK_FRAMES = "peak_frames"        #: frames compared
SAME_BALL = "same_ball"            #: bool: on every held-out frame the decoded ball agrees with eager FP32's
BALL_AGREE_FRAMES = "ball_agree_frames"  #: held-out frames whose decoded ball agrees with eager FP32's
BALL_FRAMES = "ball_frames"        #: held-out frames decoded
BALL_SHIFT_PX = "ball_max_shift_px"  #: largest shift of the decoded ball from eager FP32's, in pixels
EXPECTED_TO_MATCH = "expected_to_match_eager"  #: bool, from graphbook.method.variants
SPEEDUP_VS_EAGER = "speedup_vs_eager"  #: eager FP32 median / this median (same threads, same run)
COMPILE_S = "compile_s"            #: seconds to build the variant: compile (or export + session,
                                   #: or engine build) including the first call
TIMES_MS = "times_ms"              #: a timed row's readings (graphbook.measure.timing.TimingResult); a row timing two
                                   #: things names the second's with a prefix (``eager_times_ms`` beside
                                   #: ``eager_median_ms``). write_run keeps them beside its file, never in a CSV cell
RAW_TIMES_SUFFIX = ".times.csv.gz"  #: a results file's readings: one line per reading, ``row`` (its row in the file,
                                    #: from 0), ``series`` (the prefix, "" for times_ms), ``reading`` (from 0), ``ms``


#: Columns read as text whatever they look like (a run id of digits only must not become a number).
TEXT_COLUMNS = (RUN_ID, RECORDING_ID, "git_commit", VARIANT, "description", "note", "name", "options")


# -- Kinds --
@dataclass(frozen=True)
class Kind:
    """One kind of result file, ``<prefix>[-<tag>]-<YYYY-MM-DD>[-N].csv`` per recording: ``tagged`` kinds require the
    tag (e.g. a GPU slug), the others refuse it; ``log_file`` names the one kind that is a single growing log."""

    name: str
    prefix: str
    script: str
    tagged: bool = False
    log_file: str | None = None

    def file_regex(self) -> re.Pattern:
        tag = r"-(?P<tag>[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*?)" if self.tagged else ""
        return re.compile(rf"^{re.escape(self.prefix)}{tag}-\d{{4}}-\d{{2}}-\d{{2}}(?:-\d+)?\.csv$")

    def matches(self, file_name: str) -> bool:
        return file_name == self.log_file if self.log_file else bool(self.file_regex().match(file_name))


KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("fusion-demo", "cpu-fusion-demo", "code/03_fusion.py"),
    Kind("cpu-blurball", "cpu-blurball", "code/bench_blurball_cpu.py"),
    Kind("cpu-onnxruntime", "cpu-onnxruntime", "code/bench_onnxruntime.py"),
    Kind("ablation", "cpu-ablation", "code/bench_ablation.py"),
    Kind("attribution", "cpu-attribution", "code/bench_attribution.py"),
    Kind("serving-ready", "cpu-serving-ready", "code/bench_restart_paths.py"),
    Kind("gpu-blurball", "gpu-blurball", "code/gpu_blurball.py", tagged=True),
    Kind("gpu-tensorrt", "gpu-tensorrt", "code/gpu_tensorrt.py", tagged=True),
    Kind("int8-matrix", "cpu-int8-matrix", "code/bench_int8.py"),
    Kind("int8-tensor-errors", "cpu-int8-tensor-errors", "code/bench_int8.py"),
    Kind("restart-paths", "cpu-restart-paths", "code/bench_restart_paths.py"),
    Kind("serving-load", "cpu-serving-load", "code/bench_serving_load.py"),
    Kind("litserve-compare", "cpu-litserve-compare", "code/bench_litserve.py"),
    Kind("hostile-clients", "cpu-hostile-clients", "code/bench_litserve.py --faults"),
    Kind("freezing-repro", "cpu-freezing-repro", "code/repro_freezing_miscompile.py"),
    Kind("freezing-bisect", "cpu-freezing-bisect", "code/bisect_freezing.py"),
    Kind("freezing-minimize", "cpu-freezing-minimize", "code/minimize_freezing.py"),
    Kind("freezing-fixes", "cpu-freezing-fixes", "code/check_freezing_fixes.py (retired: torch 2.13 only)"),
    Kind("torch-versions", "cpu-torch-versions", "scripts/torch_version_history.py"),
    Kind("tvm", "cpu-tvm", "code/bench_tvm.py"),
    Kind("kernel-provenance", "cpu-kernel-provenance", "code/trace_kernel_provenance.py"),
    Kind("browser-ort", "cpu-browser-ort", "code/bench_browser_ort.py"),
    Kind("your-model", "cpu-your-model", "code/your_model.py", tagged=True),
    Kind("browser-reader", "browser-reader", "Chapter 4's in-browser panel (a reader's download)"),
    Kind("notebook-executions", "notebook-executions", "scripts/execute_notebooks.py",
         log_file="notebook_executions.csv"),
]}


def kind(name: str) -> Kind:
    """ValueError listing the known kinds when ``name`` is not one."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown result kind {name!r}; known: {', '.join(KINDS)}") from None


def _results_dir(results_dir) -> Path:
    return Path(paths.RESULTS_DIR if results_dir is None else results_dir)


def files(kind_name: str, results_dir: str | Path | None = None) -> list[Path]:
    """Every file of one kind, in name order."""
    k = kind(kind_name)
    root = _results_dir(results_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_file() and k.matches(p.name))


# -- Writing --
def write_run(kind_name: str, rows: Iterable[dict] | pd.DataFrame, env: dict | None = None,
              results_dir: str | Path | None = None, tag: str | None = None, *, per_run: bool | str = False) -> Path:
    """Write one run's ``rows``, merged with ``env``, to a NEW file of the kind and return its path; nothing is
    overwritten. ``per_run=True``: a row with :data:`RUN` ``k`` gets ``run_id`` ``<stem>/r<k>``, one per run; a column
    name instead (runs of several interpreters in one file) makes it ``<stem>/<that column's value>/r<k>``."""
    k = kind(kind_name)
    frame = _framed(rows, env, "write_run")
    day = str(env[DATE])[:10] if env and env.get(DATE) else _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    stem = "-".join([k.prefix] + ([tag] if tag else []) + [day])
    path = _unique_path(_results_dir(results_dir), stem, ".csv", RAW_TIMES_SUFFIX)
    if not k.matches(path.name):  # checked before the file exists: a bad name leaves no orphan behind
        raise ValueError(f"{path.name} does not match kind {k.name!r}'s own pattern (tagged: {k.tagged}, tag "
                         f"{tag!r}; the date comes from env['date'], got {str((env or {}).get(DATE))[:40]!r})")
    if os.environ.get(RECORDING_ENV):
        frame[RECORDING_ID] = os.environ[RECORDING_ENV]
    run_ids = pd.Series(path.stem, index=frame.index, dtype=object)
    numbered = pd.to_numeric(frame[RUN], errors="coerce").dropna() if per_run and RUN in frame else pd.Series()
    within = frame[per_run].astype(str) + "/" if isinstance(per_run, str) else pd.Series("", index=frame.index)
    run_ids[numbered.index] = [f"{path.stem}/{within[i]}r{int(run)}" for i, run in numbered.items()]
    frame.insert(0, RUN_ID, frame.pop(RUN_ID).fillna(run_ids) if RUN_ID in frame else run_ids)
    readings = {column.removesuffix(TIMES_MS): frame.pop(column) for column in list(frame.columns)
                if str(column).endswith(TIMES_MS)}
    frame.to_csv(path, mode="x", index=False)  # "x": fail rather than touch an existing file
    if readings:
        _write_raw_times(raw_times_path(path), readings)
    return path


def raw_times_path(path: str | Path) -> Path:
    """Where the readings of the results file ``path`` are kept."""
    path = Path(path)
    return path.with_name(path.stem + RAW_TIMES_SUFFIX)


def _write_raw_times(path: Path, readings: dict[str, pd.Series]) -> None:
    lines = [(row, series, index, float(ms)) for series, column in readings.items() for row, values in column.items()
             if isinstance(values, (list, tuple)) for index, ms in enumerate(values)]
    table = pd.DataFrame(lines, columns=["row", "series", "reading", "ms"]).sort_values(["row", "series", "reading"])
    with path.open("xb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as packed:
        packed.write(table.to_csv(index=False, float_format="%.17g").encode())


def raw_times(path: str | Path) -> pd.DataFrame | None:
    """The readings kept beside the results file ``path`` (``row``, ``series``, ``reading``, ``ms``), or None where
    it has none."""
    kept = raw_times_path(path)
    return pd.read_csv(kept, dtype={"series": str}, keep_default_na=False) if kept.is_file() else None


def write_and_report(kind_name: str, rows: Iterable[dict], env: dict | None = None, *,
                     results_dir: str | Path | None = None, wrote: str = "wrote {path}",
                     failure: str | None = None) -> int:
    """Write ``rows``, print ``wrote`` (with ``path`` and ``n``) and return the exit status: 1 after ``failure``."""
    rows = list(rows)
    path = write_run(kind_name, rows, env, results_dir=results_dir)
    print(wrote.format(path=path, n=len(rows)))
    if failure:
        print(failure, file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _framed(rows, env: dict | None, who: str) -> pd.DataFrame:
    """``rows`` as a frame, ``env`` filling what a row lacks; ValueError when there is no row. Dicts keep their exact
    values (``3`` stays ``3`` beside ``2.5``); a frame's whole numbers stay whole where a column has gaps."""
    if isinstance(rows, pd.DataFrame):
        frame = rows.reset_index(drop=True).convert_dtypes()
    else:
        rows = [dict(row) for row in rows]
        if not all(rows):
            raise ValueError(f"row {rows.index({})} is empty")
        frame = pd.DataFrame(rows, dtype=object)
    if frame.empty:
        raise ValueError(f"{who} needs at least one row")
    for key, value in (env or {}).items():  # a row's own value wins
        frame[key] = frame[key].fillna(value) if key in frame else value
    return frame


def append_rows(path: str | Path, rows: Iterable[dict], env: dict | None = None) -> Path:
    """Append ``rows`` to the CSV at ``path``: only for the logs that are one growing file by design. ValueError if the
    file's header differs: appending would silently misalign earlier runs' columns."""
    path = Path(path)
    frame = _framed(rows, env, "append_rows")
    columns = list(frame.columns)
    existing = None
    if path.exists():
        with path.open(newline="") as handle:
            existing = next(csv.reader(handle), None)
    if existing is not None and existing != columns:
        missing, extra = [c for c in existing if c not in columns], [c for c in columns if c not in existing]
        detail = "; ".join([f"file has columns the new rows lack: {missing}"] * bool(missing)
                           + [f"new rows have columns the file lacks: {extra}"] * bool(extra)) \
            or f"same columns in a different order: file {existing}, rows {columns}"
        raise ValueError(f"header mismatch in {path}; nothing written ({detail}). "
                         "Write to a new file (see _unique_path) instead of changing an old one.")
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, mode="a", header=existing is None, index=False)
    return path


def _unique_path(directory: str | Path, stem: str, suffix: str = ".csv", *also: str) -> Path:
    """``directory/stem.csv``, else ``stem-2``, ``stem-3``...: the first free for ``suffix`` and every ``also``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def named(counter: int, suffix: str) -> Path:
        return directory / (f"{stem}{suffix}" if counter == 1 else f"{stem}-{counter}{suffix}")

    counter = 1
    while any(named(counter, s).exists() for s in (suffix, *also)):
        counter += 1
    return named(counter, suffix)


# -- Reading --
_BOOL_TEXT = {"True": True, "False": False, "true": True, "false": False}


def _typed(frame):
    """Columns all True/False become ``bool``, or nullable ``boolean`` where some are blank."""
    for column in frame.columns:
        series = frame[column]
        if not (pd.api.types.is_object_dtype(series) or pd.api.types.is_string_dtype(series)):
            continue  # numbers, and columns already bool or boolean
        present = series.dropna()
        present = present[present.astype(str) != ""]
        if present.empty or not all(isinstance(v, bool) or v in _BOOL_TEXT for v in present):
            continue
        values = series.map(lambda v: v if isinstance(v, bool) else _BOOL_TEXT.get(v, pd.NA))
        frame[column] = values.astype("boolean") if values.isna().any() else values.astype(bool)
    return frame


def load(kind_name: str, results_dir: str | Path | None = None):
    """Every recorded run of one kind as one typed DataFrame, with ``source_file``; empty files give an empty frame."""
    frames = [load_file(path) for path in files(kind_name, results_dir)]
    if not frames:
        return pd.DataFrame({SOURCE_FILE: pd.Series(dtype=str), RUN_ID: pd.Series(dtype=str),
                             DATE: pd.Series(dtype=str)})
    return _typed(pd.concat(frames, ignore_index=True, sort=False))


def load_file(path: Path) -> pd.DataFrame:
    """One results file as a typed DataFrame, with ``source_file`` and a run id on every row."""
    frame = pd.read_csv(path, dtype=dict.fromkeys(TEXT_COLUMNS, str))  # a column the file lacks is ignored
    frame[SOURCE_FILE] = path.name
    # the notebook log has no run ids: one run per row is not a recording
    frame[RUN_ID] = frame[RUN_ID].fillna(path.stem) if RUN_ID in frame.columns else path.stem
    return _typed(frame.astype({RUN_ID: str}))


def runs(frame):
    """One row per run: ``run_id``, ``source_file``, ``date`` (its newest), ``rows``, oldest first."""
    if frame.empty:
        return pd.DataFrame(columns=[RUN_ID, SOURCE_FILE, DATE, "rows"])
    when = pd.to_datetime(frame[DATE], utc=True, errors="coerce") if DATE in frame.columns \
        else pd.Series(pd.NaT, index=frame.index)
    order = {rid: i for i, rid in enumerate(dict.fromkeys(frame[RUN_ID]))}
    table = (frame.assign(_when=when).groupby(RUN_ID, sort=False)
             .agg(source_file=(SOURCE_FILE, "first"), _when=("_when", "max"), rows=(RUN_ID, "size"))
             .reset_index())
    table["_order"] = table[RUN_ID].map(order)
    table = table.sort_values(["_when", "_order"], na_position="first", kind="stable")
    table[DATE] = table["_when"].map(lambda t: t.isoformat() if pd.notna(t) else "")
    return table[[RUN_ID, SOURCE_FILE, DATE, "rows"]].reset_index(drop=True)


def latest_run(frame):
    """The rows of the run with the latest recorded ``date`` (ties: the later in load order). Not the file name:
    ``...-2.csv`` sorts before ``...-3.csv`` but also after a later day's first file."""
    if frame.empty:
        return frame
    newest = runs(frame)[RUN_ID].iloc[-1]
    return frame[frame[RUN_ID] == newest].reset_index(drop=True)


def latest_recording(frame):
    """Every run of the newest invocation: the rows of the newest run's file (:func:`latest_run` gives only one)."""
    if frame.empty:
        return frame
    newest = runs(frame)[SOURCE_FILE].iloc[-1]
    return frame[frame[SOURCE_FILE] == newest].reset_index(drop=True)
