# Sourced by scripts/compose-*.sh (the scripts behind make up/down/logs/ps): runs compose from the repository
# root as project "trainstack", with Compose v2 (`docker compose`) or docker-compose 1.29, whichever is present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROJECT=trainstack
ENV_FILE=.env

if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  COMPOSE=(docker-compose)
else
  echo "$(basename "$0"): neither 'docker compose' (Compose v2) nor 'docker-compose' is installed;" \
       "install the Docker Compose plugin (docs/docker.md)" >&2
  exit 1
fi

# The value of KEY from the environment, else from .env, else DEFAULT (as compose itself resolves it).
setting() {
  local key=$1 default=$2 value
  value=${!key:-}
  if [ -z "$value" ] && [ -f "$ENV_FILE" ]; then
    value=$(sed -n "s/^${key}=//p" "$ENV_FILE" | tail -n 1)
  fi
  echo "${value:-$default}"
}

# Every compose command sees both trainers (profile cpu), so down/ps/logs cover whichever one ran.
compose() {
  "${COMPOSE[@]}" --project-name "$PROJECT" --profile cpu "$@"
}

# compose interpolates the whole file for every command; down, ps and logs create no Grafana container, so a
# missing password must not stop them.
allow_missing_grafana_password() {
  if [ -z "$(setting GRAFANA_ADMIN_PASSWORD '')" ]; then
    export GRAFANA_ADMIN_PASSWORD=not-used-by-this-command
  fi
}
