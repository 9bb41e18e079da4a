#!/usr/bin/env bash
# Installs the Debian packages that the test suite drives for real. Does nothing when they are all present.
# Each package is checked by a command it ships; slurm-wlm (the controller, the node daemon and the client commands)
# by three, since it is a metapackage of slurmctld, slurmd and slurm-client.
set -euo pipefail
packages=(prometheus mmdebstrap docker.io docker-compose chromium slurm-wlm slurm-wlm slurm-wlm munge)
commands=(promtool mmdebstrap dockerd docker-compose chromium slurmctld slurmd sbatch munged)
missing=()
for i in "${!commands[@]}"; do
  if ! command -v "${commands[$i]}" >/dev/null 2>&1 && [[ " ${missing[*]} " != *" ${packages[$i]} "* ]]; then
    missing+=("${packages[$i]}")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]}; install them with your package manager (Debian: apt-get install --no-install-recommends ${missing[*]})" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
