#!/usr/bin/env bash
# Install what the dashboard's browser tests (tests/test_dashboard_browser.py) need: Debian's
# chromium, which Playwright drives (Playwright's own browser download is not used). Idempotent:
# nothing to do when /usr/bin/chromium exists. Under CI a failed install fails the run (the
# browser tests fail without chromium when CI=true); elsewhere it says so and they skip.
set -uo pipefail

CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
    echo "install-browser: chromium already installed ($("$CHROMIUM" --version 2>/dev/null || echo '?'))"
    exit 0
fi
fail() {
    echo "install-browser: $1" >&2
    if [ "${CI:-}" = "true" ]; then
        exit 1
    fi
    echo "install-browser: the browser tests will skip" >&2
    exit 0
}
command -v apt-get >/dev/null 2>&1 || fail "no apt-get here to install chromium"
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=sudo
    else
        fail "not root and no passwordless sudo to install chromium"
    fi
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "install-browser: apt-get update failed; trying the install anyway" >&2
if $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null && [ -x "$CHROMIUM" ]; then
    echo "install-browser: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
else
    fail "apt-get install chromium failed"
fi
exit 0
