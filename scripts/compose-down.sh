#!/usr/bin/env bash
# make down: stop and remove the stack's containers. Volumes (runs with their checkpoints, Prometheus and
# Grafana data) are kept; pass --volumes (make down ARGS=--volumes) to delete them too.
source "$(dirname "$0")/compose-lib.sh"
allow_missing_grafana_password
compose down "$@"
