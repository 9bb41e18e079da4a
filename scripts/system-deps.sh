#!/usr/bin/env bash
# Installs the Debian packages that the test suite drives for real. Does nothing when they are all present.
set -euo pipefail
packages=(prometheus debootstrap docker.io docker-compose chromium)
commands=(promtool debootstrap dockerd docker-compose chromium)
missing=()
for i in "${!commands[@]}"; do
  command -v "${commands[$i]}" >/dev/null 2>&1 || missing+=("${packages[$i]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: missing ${missing[*]}; install them with your package manager (Debian: apt-get install --no-install-recommends ${missing[*]})" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
