#!/usr/bin/env bash
# Make sure Debian's Chromium is present for the rendered-book browser test (Playwright drives it;
# nothing downloads a browser of its own). Installs it with apt when run as root (as CI is).
set -euo pipefail
for candidate in /usr/bin/chromium /usr/bin/chromium-browser /usr/bin/google-chrome; do
  [ -x "$candidate" ] && exit 0
done
source "$(dirname "$0")/lib.sh"
need_debian_package chromium "the browser test"
