#!/usr/bin/env bash
# Run the whole test suite (arguments go to pytest). Sets the project up first if needed, and
# starts a throwaway PostgreSQL on loopback for the storage tests, removed again on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ] || [ ! -x "${TUNER_ENGINES_DIR:-.engines}/vllm/bin/python" ] \
  || { [ "${TUNER_SKIP_SGLANG:-0}" != 1 ] && [ ! -x "${TUNER_ENGINES_DIR:-.engines}/sglang/bin/python" ]; }; then
  scripts/setup.sh
fi

initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
if { [ -z "$initdb" ] || [ ! -x /usr/bin/chromedriver ]; } && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test: installing PostgreSQL, Chromium and chromedriver from Debian's packages" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql chromium chromium-driver >/dev/null
  initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
fi

pgdata=""
stop_pg() {
  if [ -n "$pgdata" ]; then
    as_pg "$(dirname "$initdb")/pg_ctl" -D "$pgdata/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$pgdata"
  fi
}
as_pg() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }
trap stop_pg EXIT

if [ -n "$initdb" ]; then
  pgdata=$(mktemp -d /tmp/tuner-pg.XXXXXX)
  chmod 755 "$pgdata"
  [ "$(id -u)" = 0 ] && chown postgres "$pgdata"
  port=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  as_pg "$initdb" -D "$pgdata/data" -U tuner --auth=trust >/dev/null
  as_pg "$(dirname "$initdb")/pg_ctl" -D "$pgdata/data" -l "$pgdata/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $pgdata" start >/dev/null
  as_pg "$(dirname "$initdb")/createdb" -h 127.0.0.1 -p "$port" -U tuner tuner_test
  export TUNER_TEST_POSTGRES="postgresql+psycopg2://tuner@127.0.0.1:$port/tuner_test"
else
  echo "test: no PostgreSQL here; its storage tests will be skipped" >&2
fi

.venv/bin/python -m pytest "$@"
