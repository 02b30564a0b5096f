"""Argument parsing shared by the book's scripts (introduced with ``code/03_fusion.py``, Chapter 2).

Every script follows one rule: bad arguments give one line on stderr and exit status 2, never a
traceback. Standard library only, so a script can validate its arguments before importing torch.
"""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr and exit status 2 (the book's script rule)."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def multiple_of_8(text: str) -> int:
    """An argparse type for BlurBall frame sizes: positive and divisible by 8 (three stride-2 levels)."""
    value = positive_int(text)
    if value % 8:
        raise argparse.ArgumentTypeError(f"expected a multiple of 8 (BlurBall downsamples 3 times), got {value}")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """An argparse type for batch sizes and the like: comma-separated positive integers, e.g. ``1,2,3``."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values
