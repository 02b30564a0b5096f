#!/usr/bin/env bash
# Record everything the pages quote as recorded, in one sitting, as a new recording under data/recordings/ (its
# files, every row stamped with its id, and a manifest; nothing earlier is touched). Run it on a quiet machine:
# no tests, notebooks or other jobs. Each benchmark's time is in the manifest and on docs/timings.md. Exit status
# 1 when a command reported a problem: the others still ran, and the manifest names it.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh || exit 2
bash scripts/setup_web.sh || exit 2    # onnxruntime-web and the exported models for bench_browser_ort
exec .venv/bin/python scripts/record_sitting.py "$@"
