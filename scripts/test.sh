#!/usr/bin/env bash
# Every test: unit tests of code/ and the book's rules, nbval (strict) on every notebook against a
# fresh execution, then a warning-free book build from the notebooks nbval just validated.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_browser.sh
start=$(date +%s)
echo "== unit tests and book-policy tests"
.venv/bin/python -m pytest tests -q -p no:cacheprovider
echo "== nbval (strict) on every chapter and appendix notebook"
.venv/bin/python -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
  --nbval-sanitize-with tests/nbval_sanitize.cfg chapters appendix
echo "== book build (-W: any warning, missing glue key or error output fails)"
rm -rf _build/html
.venv/bin/jupyter-book build --all -W -n --keep-going .
echo "== the rendered book in headless Chromium (screenshots in _build/screenshots/)"
.venv/bin/python scripts/check_rendered_book.py _build/html --screenshots _build/screenshots
echo "== all tests passed in $(( $(date +%s) - start )) s"
