#!/usr/bin/env bash
# Every test: unit tests of code/ and the book's rules, nbval (strict) on every notebook against a
# fresh execution, then a warning-free book build from the notebooks nbval just validated, then the
# rendered book in a browser. Each stage prints its own time, so a slow stage is easy to find.
# The fast tier, for the edit loop (no compile, export, process or browser; under a minute on two cores):
#   .venv/bin/python -m pytest tests -m "not slow" -n 2
# This command runs everything, the `slow` tier included.
set -euo pipefail
cd "$(dirname "$0")/.."
begin=$(date +%s)
stage_start=$begin
stage_done() { local now; now=$(date +%s); echo "   ($1: $(( now - stage_start )) s)"; stage_start=$now; }
bash scripts/setup_env.sh
bash scripts/setup_web.sh
bash scripts/setup_browser.sh
stage_done "set-up"
# Two pytest workers (pytest-xdist): the suite spends most of its time in single-threaded work (compiling, g++,
# fresh Pythons, a browser), which left one of two cores idle. A test file, and a notebook, stays whole on one
# worker (--dist loadfile): a module's fixtures are built once and a notebook's cells run in order in one kernel.
# No test asserts an absolute time, so sharing the cores changes durations, not verdicts.
echo "== the package's layers (import-linter's contracts in pyproject.toml)"
.venv/bin/lint-imports
echo "== unit tests and book-policy tests (two workers)"
.venv/bin/python -m pytest tests -q -p no:cacheprovider -n 2 --dist loadfile --durations=25
stage_done "unit and policy tests"
echo "== nbval (strict) on every chapter and appendix notebook (two workers, a notebook whole on one)"
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --nbval --nbval-current-env \
  --nbval-sanitize-with tests/nbval_sanitize.cfg chapters appendix
stage_done "nbval"
echo "== book build (-W: any warning, missing glue key or error output fails)"
rm -rf _build/html
.venv/bin/jupyter-book build --all -W -n --keep-going .
stage_done "book build"
echo "== the rendered book in headless Chromium (screenshots in _build/screenshots/)"
.venv/bin/python scripts/check_rendered_book.py _build/html --screenshots _build/screenshots
stage_done "browser check"
echo "== all tests passed in $(( $(date +%s) - begin )) s"
