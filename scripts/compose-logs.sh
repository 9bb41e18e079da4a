#!/usr/bin/env bash
# make logs: follow the stack's logs (make logs ARGS=trainer for one service).
source "$(dirname "$0")/compose-lib.sh"
allow_missing_grafana_password
compose logs --follow --tail 200 "$@"
