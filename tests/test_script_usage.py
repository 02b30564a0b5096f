"""Every script's command line on bad input: exit status 2, one stderr line naming the error, nothing on stdout,
never a traceback (README, "The scripts' command lines"; graphbook.record.cli). One table for every script in
code/, so a new script or a new refusal is one row here."""
import functools

import pytest
from cli_checks import assert_usage_error, run_cases

from graphbook import paths

# (script, arguments, text the error line must contain or None); {file} is an existing file, {dir} a fresh folder
BAD_ARGUMENTS = [
    ("03_fusion.py", ["--threads", "0"], "--threads"), ("03_fusion.py", ["--size", "10"], "--size"),
    ("03_fusion.py", ["--repeats", "2"], "--repeats"), ("03_fusion.py", ["--size", "abc"], "invalid int"),
    ("03_fusion.py", ["--feature-map", "0", "8", "8"], "--feature-map"), ("03_fusion.py", ["--runs", "2"], "integer >= 3"),
    ("03_fusion.py", ["--runs", "x"], "expected an integer"), ("03_fusion.py", ["--bogus"], "unrecognized"),
    ("03_fusion.py", ["--report-dir", "{file}/sub"], "--report-dir"),
    ("03_fusion.py", ["--results-dir", "{file}/sub"], "--results-dir"),
    ("03_fusion.py", ["--results-dir", "{file}"], "not a directory"), ("03_fusion.py", ["--out", "x"], "unrecognized"),
    ("03_fusion.py", ["--results-csv", "x.csv"], "unrecognized"),
    ("bench_attribution.py", ["--height", "100"], None), ("bench_attribution.py", ["--runs", "2"], None),
    ("bench_attribution.py", ["--repeats", "0"], None), ("bench_attribution.py", ["--results-dir", "{file}"], None),
    ("bench_ablation.py", ["--height", "100"], None), ("bench_ablation.py", ["--variants", "no such variant"], None),
    ("bench_ablation.py", ["--repeats", "0"], None), ("bench_ablation.py", ["--out", "ablation.csv"], None),
    ("bench_ablation.py", ["--results-dir", "{file}"], None), ("bench_ablation.py", ["--runs", "2"], None),
    ("bench_ablation.py", ["--runs", "many"], None), ("bench_ablation.py", ["--probe-mib", "-1"], None),
    ("bench_blurball_cpu.py", ["--threads", "0"], "positive integer"),
    ("bench_blurball_cpu.py", ["--height", "100"], "multiple of 8"),
    ("bench_blurball_cpu.py", ["--variants", "warp_drive"], "unknown variant"),
    ("bench_blurball_cpu.py", ["--repeats", "two"], "positive integer"),
    ("bench_blurball_cpu.py", ["--runs", "2"], "integer >= 3"), ("bench_blurball_cpu.py", ["--runs", "x"], "expected an integer"),
    ("bench_blurball_cpu.py", ["--probe-mib", "0"], "positive"), ("bench_blurball_cpu.py", ["--nonsense"], "unrecognized"),
    ("bench_blurball_cpu.py", ["--out-dir", "x"], "unrecognized"),
    ("bench_blurball_cpu.py", ["--results-dir", "{file}"], "not a directory"),
    ("bench_blurball_cpu.py", ["--weights", "{dir}/missing.pt"], "does not exist"),
    ("bench_blurball_cpu.py", ["--ball-clips", "-1"], "integer >= 0"),
    ("bench_blurball_cpu.py", ["--calibration-clips", "0"], "positive"),
    ("bench_browser_ort.py", ["--sizes", "100x100"], None), ("bench_browser_ort.py", ["--levels", "fast"], None),
    ("bench_browser_ort.py", ["--threads", "0"], None), ("bench_browser_ort.py", ["--runs", "2"], None),
    ("bench_compile_cache.py", ["--batch-sizes", "0"], None), ("bench_compile_cache.py", ["--height", "7"], None),
    ("bench_compile_cache.py", ["--model", "resnet"], None), ("bench_compile_cache.py", ["--threads", "zero"], None),
    ("bench_int8.py", ["--repeats", "2"], ">= 3"), ("bench_int8.py", ["--height", "100"], "multiple of 8"),
    ("bench_int8.py", ["--threads", "0"], "positive integer"),
    ("bench_int8.py", ["--debug-clips", "9", "--eval-clips", "2"], "cannot exceed"),
    ("bench_int8.py", ["--bogus"], "unrecognized"), ("bench_int8.py", ["--results-dir", "{file}"], "not a directory"),
    ("bench_litserve.py", ["--runs", "2"], None), ("bench_litserve.py", ["--concurrency", "1,x"], None),
    ("bench_litserve.py", ["--concurrency", "16"], None), ("bench_litserve.py", ["--height", "7"], None),
    ("bench_litserve.py", ["--overload-clients", "-1"], None), ("bench_litserve.py", ["--max-wait-ms", "-3"], None),
    ("bench_litserve.py", ["--model", "resnet"], None), ("bench_litserve.py", ["--faults", "--max-queue", "30"], "at most 21"),
    ("bench_litserve.py", ["--faults", "--hold", "0"], None), ("bench_litserve.py", ["--max-stalled", "1000"], "at most 256"),
    ("bench_onnxruntime.py", ["--height", "63"], None), ("bench_onnxruntime.py", ["--threads", "0"], None),
    ("bench_onnxruntime.py", ["--repeats", "-1"], None), ("bench_onnxruntime.py", ["--bogus"], None),
    ("bench_onnxruntime.py", ["--out-dir", "x"], None), ("bench_onnxruntime.py", ["--workdir", "x"], None),
    ("bench_onnxruntime.py", ["--results-dir", "{file}"], None), ("bench_onnxruntime.py", ["--runs", "2"], None),
    ("bench_onnxruntime.py", ["--runs", "three"], None), ("bench_onnxruntime.py", ["--probe-mib", "0"], None),
    ("bench_restart_paths.py", ["--paths", "eager,tensorrt"], None), ("bench_restart_paths.py", ["--height", "7"], None),
    ("bench_restart_paths.py", ["--repeats", "0"], None), ("bench_restart_paths.py", ["--paths", "compile-warm"], None),
    ("bench_restart_paths.py", ["--weights", "/nonexistent.pt"], None),
    ("bench_serving_load.py", ["--concurrency", "1,x"], None), ("bench_serving_load.py", ["--concurrency", "100"], None),
    ("bench_serving_load.py", ["--height", "7"], None), ("bench_serving_load.py", ["--artifact", "/nonexistent.onnx"], None),
    ("bench_serving_load.py", ["--max-wait-ms", "-3"], None), ("bench_serving_load.py", ["--overload-clients", "-1"], None),
    ("bench_serving_load.py", ["--runtimes", "eager,tensorrt"], None), ("bench_serving_load.py", ["--runtimes", ","], None),
    ("bench_tvm.py", ["--trials", "-1"], None), ("bench_tvm.py", ["--height", "30"], None),
    ("bench_tvm.py", ["--runs", "2"], None),
    ("bisect_freezing.py", ["--minifier-timeout", "-5"], None), ("bisect_freezing.py", ["--model", "resnet"], None),
    ("gpu_blurball.py", ["--repeats", "-1"], None),
    ("gpu_tensorrt.py", ["--variants", "bogus"], None), ("gpu_tensorrt.py", ["--repeats", "0"], None),
    ("gpu_tensorrt.py", ["--warmup", "x"], None), ("gpu_tensorrt.py", ["--no-such-option"], None),
    ("gpu_tensorrt.py", ["--smoke"], None), ("gpu_tensorrt.py", ["--qdq-model", "/no/such.onnx"], None),
    ("make_tlparse_report.py", ["--width", "0"], None),
    ("minimize_freezing.py", ["--phases", "shuffle"], "--phases"), ("minimize_freezing.py", ["--height", "30"], None),
    ("minimize_freezing.py", ["--budget", "0"], None), ("minimize_freezing.py", ["--start", "/nonexistent.py"], "--start"),
    ("minimize_freezing.py", ["--start", "{file}"], "--start"),
    ("minimize_freezing.py", ["--write-repro", "/nonexistent/folder/repro.py"], "--write-repro"),
    ("repro_freezing_minimal.py", ["--threads", "2"], None), ("repro_freezing_minimal.py", ["extra"], None),
    ("repro_freezing_miscompile.py", ["--height", "7"], None), ("repro_freezing_miscompile.py", ["--threads", "0"], None),
    ("repro_freezing_miscompile.py", ["--nonsense"], None),
    ("serve_blurball.py", ["--port", "70000"], None), ("serve_blurball.py", ["--height", "7"], None),
    ("serve_blurball.py", ["--batch-sizes", "1,x"], None), ("serve_blurball.py", ["--weights", "/nonexistent.pt"], None),
    ("serve_blurball.py", ["--save-artifacts", "a.bin"], None), ("serve_blurball.py", ["--artifact", "model.bin"], None),
    ("serve_blurball.py", ["--artifact", "/nonexistent.onnx"], None), ("serve_blurball.py", ["--max-wait-ms", "-1"], None),
    ("serve_blurball.py", ["--max-queue", "0"], None),
    ("trace_kernel_provenance.py", ["--height", "30"], "multiple of 8"),
    ("trace_kernel_provenance.py", ["--view-dir", "{file}"], "not a directory"),
    ("trace_kernel_provenance.py", ["--threads", "0"], "positive integer"),
    ("train_blurball.py", ["--height", "36", "--checkpoint-dir", "{dir}/out"], "multiple of 8"),
    ("train_blurball.py", ["--width", "abc", "--checkpoint-dir", "{dir}/out"], "expected an integer"),
    ("train_blurball.py", ["--minutes", "-1", "--checkpoint-dir", "{dir}/out"], "positive number"),
    ("train_blurball.py", ["--batch-size", "0", "--checkpoint-dir", "{dir}/out"], ">= 1"),
    ("train_blurball.py", ["--prior", "1.5", "--checkpoint-dir", "{dir}/out"], "below 1"),
    ("train_blurball.py", ["--name", "../x", "--checkpoint-dir", "{dir}/out"], "plain file stem"),
    ("train_blurball.py", ["--loss", "l1", "--checkpoint-dir", "{dir}/out"], "invalid choice"),
    ("train_blurball.py", ["--out-dir", "{dir}"], "unrecognized"), ("train_blurball.py", ["--results-dir", "{dir}"], "unrecognized"),
    ("train_blurball.py", ["--checkpoint-dir", "{file}"], "not a directory"),
]
SCRIPTS = sorted(p.name for p in paths.CODE_DIR.glob("*.py"))
HELP = ["--help"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder per case (the script's working folder) holding ``a_file``, a file where a folder is expected."""
    root = tmp_path_factory.mktemp("usage")
    folders = {}
    for number, (script, args, _) in enumerate(BAD_ARGUMENTS):
        folder = root / f"case{number}"
        folder.mkdir()
        (folder / "a_file").write_text("not a directory")
        folders[(script, tuple(args))] = folder
    return root, folders


def _argv(args, folder):
    return [arg.format(file=folder / "a_file", dir=folder) for arg in args]


@functools.cache
def _outcomes(script: str, root: str) -> dict:
    """Every case of ``script`` (its refusals and ``--help``) run in one fresh Python: case -> CompletedProcess."""
    import pathlib

    root = pathlib.Path(root)
    keys = [tuple(args) for s, args, _ in BAD_ARGUMENTS if s == script]
    folders = [root / f"case{i}" for i, (s, _, _) in enumerate(BAD_ARGUMENTS) if s == script]
    cases = [(_argv(args, folder), str(folder)) for args, folder in zip(keys, folders)] + [(HELP, str(root))]
    done = run_cases(str(paths.script(script)), cases)
    return dict(zip([*keys, tuple(HELP)], done))


@pytest.mark.parametrize("script, args, message", BAD_ARGUMENTS,
                         ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD_ARGUMENTS])
def test_bad_arguments_exit_2_with_one_line(script, args, message, work):
    root, folders = work
    assert_usage_error(_outcomes(script, str(root))[tuple(args)], message)
    assert not (folders[(script, tuple(args))] / "out").exists(), "a refused command must write nothing"


def test_every_script_has_its_refusals_in_the_table():
    assert sorted({script for script, _, _ in BAD_ARGUMENTS}) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0(script, work):
    proc = _outcomes(script, str(work[0]))[tuple(HELP)]
    assert proc.returncode == 0 and "usage" in proc.stdout.lower() and proc.stderr == "", proc.stderr


def test_the_batch_reports_a_traceback_as_a_crash(tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("raise ValueError('boom')\n")
    proc, = run_cases(str(crash), [(["--x"], str(tmp_path))])
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "boom" in proc.stderr
    with pytest.raises(AssertionError):
        assert_usage_error(proc)
