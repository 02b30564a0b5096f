#!/usr/bin/env bash
# Every test: unit tests of code/ and the book's rules, nbval (strict) on every notebook against a
# fresh execution, then a warning-free book build from the notebooks nbval just validated, then the
# rendered book in a browser. Each stage prints its own time, so a slow stage is easy to find.
# (For the edit loop: `.venv/bin/python -m pytest tests -m "not slow"`; this command runs everything.)
set -euo pipefail
cd "$(dirname "$0")/.."
begin=$(date +%s)
stage_start=$begin
stage_done() { local now; now=$(date +%s); echo "   ($1: $(( now - stage_start )) s)"; stage_start=$now; }
bash scripts/setup_env.sh
bash scripts/setup_web.sh
bash scripts/setup_browser.sh
stage_done "set-up"
echo "== unit tests and book-policy tests"
.venv/bin/python -m pytest tests -q -p no:cacheprovider
stage_done "unit and policy tests"
echo "== nbval (strict) on every chapter and appendix notebook"
.venv/bin/python -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
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
