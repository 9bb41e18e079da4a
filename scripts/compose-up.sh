#!/usr/bin/env bash
# make up: build the image and start the trainer (on every GPU when Docker has the NVIDIA runtime, else on 2 CPU
# ranks), Prometheus and Grafana; wait until the trainer's exporter answers; print the URLs.
#   TRAINSTACK_DEVICE=gpu|cpu    skip the detection
#   TRAINSTACK_UP_TIMEOUT=600    seconds to wait for the trainer to become healthy
#   arguments                    passed to `compose up` (make up ARGS=--no-build)
source "$(dirname "$0")/compose-lib.sh"

# Appends KEY=VALUE to .env unless KEY is already set there or in the environment. .env is git-ignored.
ensure_setting() {
  local key=$1 value=$2
  [ -n "$(setting "$key" '')" ] && return 1
  (umask 077 && touch "$ENV_FILE")
  if [ -s "$ENV_FILE" ] && [ -n "$(tail -c 1 "$ENV_FILE")" ]; then echo >> "$ENV_FILE"; fi
  echo "$key=$value" >> "$ENV_FILE"
}

if ! docker_error=$(docker info 2>&1 >/dev/null); then
  echo "make up: cannot reach the Docker daemon (${docker_error##*$'\n'}); start Docker or check DOCKER_HOST" >&2
  exit 1
fi

if ensure_setting GRAFANA_ADMIN_PASSWORD "$(od -An -N18 -tx1 /dev/urandom | tr -d ' \n')"; then
  echo "make up: generated a Grafana admin password: GRAFANA_ADMIN_PASSWORD in $PWD/$ENV_FILE"
fi
# So that plain `docker compose ps/logs/down` address the same project as these scripts.
ensure_setting COMPOSE_PROJECT_NAME "$PROJECT" || true

device=${TRAINSTACK_DEVICE:-}
if [ -z "$device" ]; then
  runtimes=$(docker info --format '{{json .Runtimes}}')
  if [[ $runtimes == *'"nvidia"'* ]]; then device=gpu; else device=cpu; fi
  detected=" (detected from docker info's runtimes; TRAINSTACK_DEVICE=gpu|cpu overrides)"
fi
case "$device" in
  gpu) trainer=trainer other=trainer-cpu
       echo "make up: NVIDIA runtime: training on every GPU, service trainer${detected:-}" ;;
  cpu) trainer=trainer-cpu other=trainer
       echo "make up: no NVIDIA runtime: training on 2 CPU ranks, service trainer-cpu${detected:-}" ;;
  *) echo "make up: TRAINSTACK_DEVICE must be gpu or cpu, got '$device'" >&2; exit 2 ;;
esac

# The other trainer (from an earlier `make up` on this host) would hold the exporter port.
compose rm --stop --force "$other" >/dev/null 2>&1 || true
# Rebuild by default so the image has the checkout's code (cached layers make that quick); --no-build skips it.
build=--build
for option in "$@"; do [ "$option" = --no-build ] && build=; done
compose up --detach ${build} "$@" "$trainer" prometheus grafana

container=$(compose ps --all --quiet "$trainer")
[ -n "$container" ] || { echo "make up: compose started no $trainer container; see make logs" >&2; exit 1; }
deadline=$((SECONDS + ${TRAINSTACK_UP_TIMEOUT:-600}))
echo "make up: waiting for the trainer's exporter to answer (first start: model setup and preflight checks)"
while :; do
  state=$(docker inspect --format \
    '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} {{.State.ExitCode}}' \
    "$container")
  read -r status health exit_code <<<"$state"
  [ "$status" = running ] && [ "$health" = healthy ] && break
  if [ "$status" = exited ] || [ "$status" = dead ]; then
    if [ "$exit_code" = 0 ]; then
      echo "make up: the trainer already finished its run (exit 0); its results are in the runs volume"
      break
    fi
    compose logs --tail 40 "$trainer" >&2
    echo "make up: the trainer exited with code $exit_code (logs above; 2 = configuration error," \
         "see docs/training.md)" >&2
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "make up: the trainer is still $status/$health after ${TRAINSTACK_UP_TIMEOUT:-600} s; see make logs" >&2
    exit 1
  fi
  sleep 3
done

bind=$(setting TRAINSTACK_BIND_ADDRESS 127.0.0.1)
cat <<URLS

  Grafana     http://$bind:$(setting GRAFANA_PORT 3000)   user admin, password: GRAFANA_ADMIN_PASSWORD in $PWD/$ENV_FILE
  Prometheus  http://$bind:$(setting PROMETHEUS_PORT 9090)
  Exporter    http://$bind:$(setting TRAINSTACK_EXPORTER_PORT 9450)/metrics

  make logs (follow)   make ps (state)   make down (stop; the runs volume keeps checkpoints)
URLS
