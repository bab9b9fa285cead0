#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL on loopback, removed again on exit (also on failure or
# Ctrl-C), its URL in TUNER_TEST_POSTGRES:  scripts/with-postgres.sh CMD [ARGS...]
# Without PostgreSQL's binaries the command runs without it: the PostgreSQL tests then fail, unless
# TUNER_SKIP_TIERS=postgres leaves them out (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
pgdata=""
as_pg() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }
stop_pg() {
  if [ -n "$pgdata" ]; then
    as_pg "$(dirname "$initdb")/pg_ctl" -D "$pgdata/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$pgdata"
  fi
}
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
  echo "with-postgres: no PostgreSQL here; running without it" >&2
fi
# not exec: the trap must still remove the database when the command ends
"$@"
