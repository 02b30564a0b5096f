"""The shared argument types: bad values give argparse errors (one line, exit 2), good ones pass."""
import argparse

import pytest

from graphbook import cli


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
