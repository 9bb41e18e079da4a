#!/bin/sh
# Installs the OS packages named on the command line, skipping each one the base image already provides, so a
# base that ships Python (the NGC PyTorch image, an air-gapped registry's mirror) builds with no package mirror.
set -eu
missing=""
for package in "$@"; do
  case "$package" in
    python3) command -v python3 >/dev/null 2>&1 || missing="$missing python3" ;;
    python3-venv) python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$missing python3-venv" ;;
    tini) command -v tini >/dev/null 2>&1 || missing="$missing tini" ;;
    *) echo "install-os-packages.sh: no presence check for '$package'; add one here" >&2; exit 2 ;;
  esac
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-os-packages.sh: the base image lacks$missing and has no apt-get; use a Debian/Ubuntu base" >&2
  exit 1
fi
apt-get update
# shellcheck disable=SC2086  # one word per package
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
rm -rf /var/lib/apt/lists/*
