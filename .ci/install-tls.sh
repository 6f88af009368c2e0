#!/usr/bin/env bash
# Install what the TLS tests (tests/test_security.py) need: stunnel4 to terminate TLS in front
# of the embedded server (its valkey-server is built without TLS) and the openssl CLI for a
# self-signed certificate. Idempotent; without root (or apt) it says so and leaves the TLS
# tests to skip.
set -uo pipefail

if command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1; then
    if command -v openssl >/dev/null 2>&1; then
        echo "install-tls: stunnel and openssl already installed"
        exit 0
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-tls: no apt-get here; the TLS tests will skip" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=sudo
    else
        echo "install-tls: not root and no passwordless sudo; the TLS tests will skip" >&2
        exit 0
    fi
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "install-tls: apt-get update failed; trying the install anyway" >&2
if $SUDO apt-get install -y -qq --no-install-recommends stunnel4 openssl >/dev/null; then
    echo "install-tls: installed stunnel4 and openssl"
else
    echo "install-tls: apt-get install failed; the TLS tests will skip" >&2
fi
exit 0
