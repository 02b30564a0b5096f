"""The shared argument types: bad values give argparse errors (one line, exit 2), good ones pass."""
import argparse

import pytest

from graphbook.record import cli


def test_positive_int_and_multiple_of_8():
    assert cli.positive_int("3") == 3
    assert cli.multiple_of_8("288") == 288
    for bad in ("0", "-2", "x", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.positive_int(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="multiple of 8"):
        cli.multiple_of_8("100")


def test_parser_error_is_one_line_and_exit_2(capsys):
    parser = cli.OneLineParser(prog="demo")
    parser.add_argument("--n", type=cli.positive_int)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--n", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("demo: error:")


def test_positive_int_list():
    assert cli.positive_int_list("1,2,3") == (1, 2, 3)
    for bad in ("1,x", "0,1", "", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.positive_int_list(bad)


def test_make_parser_takes_results_dir(tmp_path):
    parser = cli.make_parser("demo", "a demo")
    assert parser.parse_args([]).results_dir is None  # the writer then uses paths.RESULTS_DIR
    target = tmp_path / "new" / "deeper"
    assert parser.parse_args(["--results-dir", str(target)]).results_dir == target
    assert not target.exists(), "parsing must not create the folder"
    assert not hasattr(cli.make_parser("demo", "a demo", results_dir=False).parse_args([]), "results_dir")


@pytest.mark.parametrize("make_bad, message", [
    (lambda d: d / "a_file", "exists and is not a directory"),
    (lambda d: d / "a_file" / "sub", "cannot be created"),
])
def test_results_dir_that_cannot_be_a_folder_is_refused(tmp_path, capsys, make_bad, message):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        cli.make_parser("demo", "a demo").parse_args(["--results-dir", str(make_bad(tmp_path))])
    assert exit_info.value.code == cli.EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_exit_status_policy(capsys):
    assert (cli.EXIT_OK, cli.EXIT_CHECK_FAILED, cli.EXIT_USAGE, cli.EXIT_RESOURCE_ABSENT) == (0, 1, 2, 3)
    assert cli.exit_status_for("demo", []) == 0 and capsys.readouterr().err == ""
    assert cli.exit_status_for("demo", ["bf16", "int8", "bf16"]) == 1
    err = capsys.readouterr().err
    assert err == "demo: failed its correctness check against eager: bf16, int8\n"
    assert cli.resource_absent("demo", "CUDA is not available") == 3
    assert capsys.readouterr().err == "demo: CUDA is not available\n"


def test_int_at_least_and_positive_float():
    assert cli.int_at_least(0)("0") == 0 and cli.int_at_least(32)("96") == 96
    with pytest.raises(argparse.ArgumentTypeError, match=">= 32"):
        cli.int_at_least(32)("31")
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer"):
        cli.int_at_least(1)("x")
    assert cli.positive_float("3e-4") == pytest.approx(3e-4)
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.positive_float(bad)


def test_run_checked_is_a_benchmarks_main(capsys):
    parsed = []

    def parse_args(argv):
        parsed.append(argv)
        return {"argv": argv}

    assert cli.run_checked("demo", parse_args, lambda args: ("written", []), ["--x"]) == 0
    assert cli.run_checked("demo", parse_args, lambda args: ("written", ["compile_freezing"]), []) == 1
    assert parsed == [["--x"], []]
    assert capsys.readouterr().err.strip() == "demo: failed its correctness check against eager: compile_freezing"


def test_comma_choices_keeps_order_drops_duplicates_and_names_the_choices():
    pick = cli.comma_choices(("eager", "ort-raw", "aoti-cpp"), "restart path")
    assert pick("aoti-cpp, eager,aoti-cpp") == ("aoti-cpp", "eager")
    for bad in ("", ",", "eager,tensorrt"):
        with pytest.raises(argparse.ArgumentTypeError, match="restart path .*choose from eager,ort-raw,aoti-cpp"):
            pick(bad)
