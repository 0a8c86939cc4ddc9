#!/usr/bin/env bash
# System packages the end-to-end tests need: sshd (the SSH box path), chromium (the report), and
# Slurm with munge (the Slurm box path: tests/slurm.py starts a one-node cluster); and fincore
# (util-linux), which reads what the page cache holds of a runtime's files (the demo's box-state
# probe), and vmtouch, the same reading on macOS. `install-sysdeps.sh demo` checks only what
# `make demo` needs.
# Installed with apt-get only when running as root and missing; otherwise say what is missing.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

missing=()
# Debian 12 ships fincore in util-linux-extra; older releases in util-linux itself.
have fincore || missing+=(util-linux-extra)
if [ "${1:-all}" = "all" ]; then
    have sshd || missing+=(openssh-server)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    # slurm-wlm brings slurmctld, slurmd and the clients (sbatch, squeue, sinfo, scancel, srun).
    { have slurmctld && have slurmd && have sbatch; } || missing+=(slurm-wlm)
    have munged || missing+=(munge)
    # vmtouch reads the page cache on a Mac, where the ds4 Metal profiles' probe runs; the
    # tests run it here on the same files (its output is the same on Linux).
    have vmtouch || missing+=(vmtouch)
fi

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
