#!/bin/sh
# The build stage's pip steps, in two layers so that a code change does not reinstall PyTorch:
#   build-venv.sh deps DEPS_DIR           /opt/venv with the pinned dependencies (DEPS_DIR/requirements.lock)
#   build-venv.sh wheel DEPS_DIR SRC OUT  trainstack's own wheel, built from SRC into OUT
# Environment (the Dockerfile's build arguments):
#   WHEELHOUSE       non-empty: DEPS_DIR also holds every wheel needed; install from it alone (pip --no-index)
#   TORCH_FROM_BASE  1: keep the base image's own PyTorch (NGC images): the venv sees the system
#                    site-packages and the lock's torch pin is skipped
set -eu
step=$1
deps=$2
pip_options="--no-cache-dir --disable-pip-version-check"
if [ -n "${WHEELHOUSE:-}" ]; then
  pip_options="$pip_options --no-index --find-links $deps"
fi
# shellcheck disable=SC2086  # pip_options is a list of words without spaces inside them
case "$step" in
  deps)
    if [ "${TORCH_FROM_BASE:-0}" = 1 ]; then
      # NGC images pin their own packages through pip constraints; in this venv the lock's versions win
      # (they shadow the system's), while torch and its CUDA libraries stay the base image's.
      unset PIP_CONSTRAINT
      export PIP_CONFIG_FILE=/dev/null
      python3 -m venv --system-site-packages /opt/venv
      grep -v '^torch==' "$deps/requirements.lock" > /tmp/requirements.txt
    else
      python3 -m venv /opt/venv
      cp "$deps/requirements.lock" /tmp/requirements.txt
    fi
    /opt/venv/bin/python -m pip install $pip_options -r /tmp/requirements.txt
    rm /tmp/requirements.txt
    ;;
  wheel)
    /opt/venv/bin/python -m pip wheel $pip_options --no-deps --wheel-dir "$4" "$3"
    ;;
  *)
    echo "build-venv.sh: unknown step '$step'; use deps or wheel" >&2
    exit 2
    ;;
esac
