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
fi

# a throwaway PostgreSQL on loopback for the storage tests (scripts/with-postgres.sh)
scripts/with-postgres.sh .venv/bin/python -m pytest "$@"
