#!/usr/bin/env sh
# What the tests need from the system, beyond Python: redis-server (every test starts its own),
# Debian's chromium (the inbox's browser tests; never a downloaded browser) and promtool (the
# shipped Prometheus rules are checked with it) and Node.js with npm (the real AG-UI client,
# @ag-ui/client from npm, drives the AG-UI endpoint in tests/e2e/test_agui.py). Installed here when this runs as root with apt;
# otherwise it stops at once with the one command that installs them.
set -eu
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing the Debian packages the tests need:$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  exit 0
fi
echo "the tests need Debian packages that are missing:$missing" >&2
echo "install them with: sudo apt-get install -y$missing" >&2
exit 1
