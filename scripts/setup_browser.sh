#!/usr/bin/env bash
# Make sure Debian's Chromium is present for the rendered-book browser test (Playwright drives it;
# nothing downloads a browser of its own). Installs it with apt when run as root (as CI is).
set -euo pipefail
for candidate in /usr/bin/chromium /usr/bin/chromium-browser /usr/bin/google-chrome; do
  [ -x "$candidate" ] && exit 0
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser test ..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "error: the browser test needs Chromium: install it (e.g. 'sudo apt-get install chromium') and re-run" >&2
  exit 2
fi
