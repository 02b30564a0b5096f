#!/usr/bin/env bash
# Re-record every CPU benchmark the chapters show as "recorded" (each appends to data/results/,
# never overwriting). Run it on a quiet machine: about half an hour on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
PY=.venv/bin/python
run() { echo "== $*"; start=$(date +%s); "$PY" "$@"; echo "   ($(( $(date +%s) - start )) s)"; }
run code/03_fusion.py
run code/bench_blurball_cpu.py
run code/bench_onnxruntime.py
run code/bench_ablation.py
run code/bench_compile_cache.py --server
