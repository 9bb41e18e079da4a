#!/usr/bin/env bash
# make ps: the stack's containers with their state and health.
source "$(dirname "$0")/compose-lib.sh"
allow_missing_grafana_password
compose ps "$@"
