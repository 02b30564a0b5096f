#!/usr/bin/env bash
# Chapter 4's in-browser model: the pinned onnxruntime-web (package.json + package-lock.json in
# _ext/ortweb, installed with `npm ci` from the npm registry) and the BlurBall files the page runs,
# exported by the book's own code (graphbook.runtimes.browser_runtime) into _ext/ortweb/assets. Both README
# commands run it after setup_env.sh; it is idempotent and quick when nothing changed. The book build then
# copies only the files the page needs into _static/ortweb (_ext/ortweb_assets.py).
set -euo pipefail
cd "$(dirname "$0")/.."
WEB=_ext/ortweb
if ! command -v npm >/dev/null; then
  source scripts/lib.sh
  need_debian_package npm "the in-browser model"
fi
# npm ci again only when the lock file changed since the last install (its sum is kept beside node_modules).
lock_sum=$(sha256sum "$WEB/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$WEB/node_modules/.graphbook-lock-sha256" ] || [ "$(cat "$WEB/node_modules/.graphbook-lock-sha256")" != "$lock_sum" ]; then
  # --ignore-scripts: the page needs onnxruntime-web's files only, no package's install script
  npm ci --prefix "$WEB" --no-audit --no-fund --ignore-scripts --loglevel=error
  echo "$lock_sum" > "$WEB/node_modules/.graphbook-lock-sha256"
fi
.venv/bin/python -m graphbook.runtimes.browser_runtime
