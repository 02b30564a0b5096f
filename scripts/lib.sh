# Shell helpers shared by the set-up scripts (sourced, not run).

# need_debian_package PACKAGE PURPOSE: install Debian's PACKAGE with apt when running as root (as CI does);
# otherwise stop with one line saying what to install and why, exit status 2.
need_debian_package() {
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "installing Debian's $1 for $2 ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  else
    echo "error: $2 needs $1: install it (e.g. 'sudo apt-get install $1') and re-run" >&2
    exit 2
  fi
}
