#!/usr/bin/env bash
# System packages the end-to-end tests need: sshd (the SSH box path) and chromium (the report).
# Installed with apt-get only when running as root and missing; otherwise say what is missing.
set -euo pipefail

missing=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-sysdeps: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" >&2
    exit 0
fi
echo "install-sysdeps: installing ${missing[*]} with apt-get"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
