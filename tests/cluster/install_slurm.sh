#!/bin/sh
# Installs what the slurm-marked tests run (tests/cluster): Debian's slurm-wlm (slurmctld,
# slurmd and the client commands) and munge. A no-op, in milliseconds, when they are there.
# It installs only as root on a system with apt-get; elsewhere it says why and exits 0, and the
# slurm tests then skip, naming the reason. `make test` runs it first.
set -eu
missing=""
for cmd in munged slurmctld slurmd sbatch srun squeue sinfo scontrol scancel; do
    command -v "$cmd" >/dev/null 2>&1 || missing="$missing $cmd"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_slurm.sh: missing$missing; not installing (needs root and apt-get):" \
         "the slurm tests will skip" >&2
    exit 0
fi
echo "install_slurm.sh: installing slurm-wlm and munge (missing$missing)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
    || { apt-get update -q >/dev/null && \
         apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; } \
    || { echo "install_slurm.sh: apt-get could not install slurm-wlm munge" >&2; exit 1; }
