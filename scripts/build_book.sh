#!/usr/bin/env bash
# The main job: re-execute every chapter in place (so every stored number comes from this run on
# this machine), then build the HTML book from those outputs. The book lands in _build/html/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_web.sh     # onnxruntime-web and the models of Chapter 4's in-browser run
.venv/bin/python scripts/execute_notebooks.py --all
rm -rf _build/html
.venv/bin/jupyter-book build --all -W -n --keep-going .
echo "The book is at $(pwd)/_build/html/index.html"
