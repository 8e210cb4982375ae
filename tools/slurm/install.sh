#!/usr/bin/env bash
# Install what the single-node test cluster needs (tools/slurm/cluster.py): Debian's slurm-wlm (slurmctld,
# slurmd, sbatch, ...), munge, and slurmdbd + mariadb-server so that `sacct` works (submitit reads the
# state of killed jobs only from sacct). Idempotent: exits 0 at once when everything is there.
# Needs root and apt (Debian / Ubuntu). Services are not started or enabled here; cluster.py runs the
# daemons itself under a temporary root and stops them by PID.
set -euo pipefail

needed=(slurmctld slurmd slurmdbd sbatch sacct munged mariadbd)
missing=()
for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$cmd")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "slurm install: already installed ($(dpkg-query -W -f '${Version}' slurm-wlm 2>/dev/null))"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm install: missing ${missing[*]}; installing needs root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm install: missing ${missing[*]}; no apt-get on this machine" >&2
    exit 1
fi
echo "slurm install: installing slurm-wlm munge slurmdbd mariadb-server (missing: ${missing[*]})"
started=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm munge slurmdbd mariadb-server mariadb-client >/dev/null
echo "slurm install: done in $(( $(date +%s) - started )) s (slurm-wlm $(dpkg-query -W -f '${Version}' slurm-wlm))"
