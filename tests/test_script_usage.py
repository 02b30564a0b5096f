"""Every script's command line, called as ``main(argv)`` in this process: a refused argument exits 2 with one
stderr line saying what is wrong and writes nothing; ``--help`` works; results go to ``--results-dir``."""
import pytest

from graphbook import paths
from graphbook.record import cli

# (script, arguments, text of the error line); {file} is an existing file, {dir} a folder holding only it
REFUSALS = [
    ("03_fusion.py", ["--size", "10"], "--size"),
    ("03_fusion.py", ["--runs", "2"], ">= 3"),
    ("bench_ablation.py", ["--variants", "warp_drive"], "unknown variant"),
    ("bench_attribution.py", ["--height", "100"], "multiple of 8"),
    ("bench_blurball_cpu.py", ["--variants", "warp_drive"], "unknown variant"),
    ("bench_blurball_cpu.py", ["--weights", "{dir}/missing.pt"], "does not exist"),
    ("bench_browser_ort.py", ["--sizes", "100x100"], "unknown size"),
    ("bench_int8.py", ["--debug-clips", "9", "--eval-clips", "2"], "cannot exceed"),
    ("bench_litserve.py", ["--faults", "--max-queue", "30"], "at most 21"),
    ("bench_onnxruntime.py", ["--threads", "0"], ">= 1"),
    ("bench_restart_paths.py", ["--paths", "eager,tensorrt"], "unknown restart path tensorrt"),
    ("bench_restart_paths.py", ["--paths", "compile-warm"], "need compile-cold"),
    ("bench_restart_paths.py", ["--workdir", "{dir}"], "is not empty"),
    ("bench_serving_load.py", ["--concurrency", "16"], "must not exceed --max-queue"),
    ("bench_serving_load.py", ["--max-wait-ms", "-3"], "0..1000"),
    ("bench_serving_load.py", ["--artifact", "{dir}/model.onnx"], "must be an existing"),
    ("bench_tvm.py", ["--results-dir", "{file}"], "not a directory"),
    ("bisect_freezing.py", ["--minifier-timeout", "-5"], ">= 0"),
    ("gpu_blurball.py", ["--weights", "{dir}/missing.pt"], "is not a file"),
    ("gpu_tensorrt.py", ["--qdq-model", "{dir}/missing.onnx"], "is not a file"),
    ("make_tlparse_report.py", ["--out", "{file}"], "not a directory"),
    ("minimize_freezing.py", ["--phases", "shuffle"], "unknown phase"),
    ("minimize_freezing.py", ["--write-repro", "{dir}/no/such/repro.py"], "does not exist"),
    ("repro_freezing_miscompile.py", ["--height", "7"], "multiples of 8"),
    ("serve_blurball.py", ["--port", "70000"], "0..65535"),
    ("serve_blurball.py", ["--batch-sizes", "0"], "positive integers"),
    ("serve_blurball.py", ["--artifact", "{file}"], "must end in .pt2"),
    ("serve_blurball.py", ["--save-artifacts", "a.bin"], "only make sense with --compile"),
    ("trace_kernel_provenance.py", ["--view-dir", "{file}"], "not a directory"),
    ("trace_kernel_provenance.py", ["--model", "tiny", "--results-dir", str(paths.DATA_DIR / "results")],
     "must not replace the book's record"),
    ("trace_kernel_provenance.py", ["--model", "tiny", "--results-dir", "{dir}", "--view-dir",
                                    str(paths.PROVENANCE_VIEW_DIR)], "must not replace the book's record"),
    ("train_blurball.py", ["--height", "36"], "multiple of 8"),
    ("train_blurball.py", ["--prior", "1.5"], "below 1"),
    ("train_blurball.py", ["--name", "../x"], "plain file stem"),
    ("your_model.py", ["--model", "a:b"], "one of the arguments --inputs --shape is required"),
    ("your_model.py", ["--model", "a:b", "--shape", "3,8,8", "--name", "../x"], "--name must be"),
]
#: The upstream reproducer written by minimize_freezing.py (its two options: tests/test_miscompile_minimizer.py).
GENERATED = {"repro_freezing_minimal.py"}
SCRIPTS = sorted(p.name for p in paths.CODE_DIR.glob("*.py") if p.name not in GENERATED)
#: Scripts whose output is not a results file: a checkpoint, a report, a server, a reproducer's verdict.
NO_RESULTS = {"make_tlparse_report.py", "repro_freezing_miscompile.py", "serve_blurball.py", "train_blurball.py"}


@pytest.mark.parametrize("name, args, message", REFUSALS, ids=[f"{s}:{' '.join(a)}" for s, a, _ in REFUSALS])
def test_a_refused_argument_exits_2_with_one_line_and_writes_nothing(name, args, message, script, tmp_path,
                                                                      monkeypatch, capsys):
    (tmp_path / "a_file").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        script(name).main([a.format(file=tmp_path / "a_file", dir=tmp_path) for a in args])
    out, err = capsys.readouterr()
    assert stop.value.code == cli.EXIT_USAGE and out == ""
    assert message in err.strip().splitlines()[-1], err
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"], "a refused command must write nothing"


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_exits_0_and_names_the_results_dir(name, script, capsys):
    with pytest.raises(SystemExit) as stop:
        script(name).main(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "usage" in out.lower()
    assert ("--results-dir" in out) == (name not in NO_RESULTS)


def test_results_dir_defaults_to_the_books_folder_and_a_failed_check_is_exit_1_naming_each_variant(tmp_path, capsys):
    parser = cli.make_parser("demo", "a demo")
    assert parser.parse_args([]).results_dir == paths.RESULTS_DIR
    target = tmp_path / "new" / "deeper"
    assert parser.parse_args(["--results-dir", str(target)]).results_dir == target and not target.exists()
    assert cli.exit_status_for("demo", []) == cli.EXIT_OK and capsys.readouterr().err == ""
    assert cli.exit_status_for("demo", ["bf16", "int8", "bf16"]) == cli.EXIT_CHECK_FAILED
    assert capsys.readouterr().err == "demo: failed its correctness check against eager: bf16, int8\n"


def test_a_page_whose_run_cannot_be_logged_is_one_error_line_and_exit_1_with_the_log_untouched(script, tmp_path,
                                                                                             monkeypatch, capsys):
    pages = script("scripts/execute_notebooks.py")
    page = tmp_path / "page.ipynb"
    page.write_text("{}")
    log = tmp_path / "data" / "results" / "notebook_executions.csv"
    log.parent.mkdir(parents=True)
    log.write_text("notebook,seconds,an_older_column\npage.ipynb,1.0,x\n")
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    monkeypatch.setattr(pages, "execute", lambda path, timeout: {"notebook": "page.ipynb", "seconds": 2.0})
    assert pages.main([str(page)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("execute_notebooks.py: error: page.ipynb ran and was written") and err.count("\n") == 1
    assert "an_older_column" in err and log.read_text().count("\n") == 2


def test_the_pages_of_one_run_compile_from_an_inductor_cache_empty_at_its_start(script, tmp_path, monkeypatch):
    pages = script("scripts/execute_notebooks.py")
    first, second = tmp_path / "one.ipynb", tmp_path / "two.ipynb"
    for page in (first, second):
        page.write_text("{}")
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "the machine's own"))
    seen = []

    def execute(path, timeout):
        cache = pages.os.environ["TORCHINDUCTOR_CACHE_DIR"]
        seen.append((cache, sorted(pages.Path(cache).iterdir())))
        (pages.Path(cache) / f"compiled-by-{path.stem}").touch()
        return {"notebook": path.name, "seconds": 1.0}

    monkeypatch.setattr(pages, "execute", execute)
    assert pages.main([str(first), str(second)]) == 0
    (cache, at_first), (same, at_second) = seen
    assert at_first == [] and same == cache != str(tmp_path / "the machine's own")   # one new cache for the run
    assert [p.name for p in at_second] == ["compiled-by-one"]
    assert pages.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "the machine's own")
