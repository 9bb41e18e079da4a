#!/usr/bin/env bash
# Downloads every wheel the image installs (requirements.lock, its dependencies, and the build backend for
# trainstack itself) into a directory, for `--build-arg WHEELHOUSE=<dir>` builds that must not reach an index.
#
# Usage: docker/wheelhouse.sh [DIR] [PYTHON_VERSION GLIBC_VERSION]
#   DIR             where the wheels go, inside the build context (default: wheelhouse)
#   PYTHON_VERSION  the image's Python and glibc when they differ from this machine's: 3.12 2.39 for the default
#   GLIBC_VERSION   CUDA base (Ubuntu 24.04), 3.11 2.36 for Debian 12; wheels are then picked for x86_64 Linux
#                   with that Python and at most that glibc
# Extra pip options pass through PIP_* variables, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# for the CPU build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-wheelhouse}
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=${PYTHON:-.venv/bin/python}
target=()
if [ -n "${2:-}" ]; then
  glibc_minor=${3:?give the glibc version of the image too, e.g. 2.39 (ldd --version in the image)}
  glibc_minor=${glibc_minor#2.}
  # pip matches --platform literally, so list every manylinux level the image's glibc can load.
  target=(--python-version "$2" --implementation cp --platform manylinux2014_x86_64)
  for level in $(seq 17 "$glibc_minor"); do target+=(--platform "manylinux_2_${level}_x86_64"); done
fi
# pip builds trainstack itself in an isolated environment: its build backend must be in the wheelhouse too.
mapfile -t build_requires < <("$python" -c \
  'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')
mkdir -p "$dir"
"$python" -m pip download --disable-pip-version-check --only-binary=:all: "${target[@]}" --dest "$dir" \
  -r requirements.lock "${build_requires[@]}"
echo "wheelhouse: $(find "$dir" -name '*.whl' | wc -l) wheels in $dir; build with --build-arg WHEELHOUSE=$dir"
