#!/usr/bin/env bash
# Run the whole test suite (arguments go to pytest), its files spread over TUNER_TEST_WORKERS processes
# (default 4). Sets the project up first if needed, and starts a throwaway PostgreSQL on loopback for the
# storage tests, removed again on exit.
#
# Two tiers of tests need system packages: `postgres` (PostgreSQL's initdb under
# /usr/lib/postgresql/*/bin) and `browser` (/usr/bin/chromium and /usr/bin/chromedriver). What is
# missing is installed from Debian's packages when run as root with apt-get; otherwise the script
# stops with one line naming it. Nothing is skipped silently: TUNER_SKIP_TIERS=postgres,browser
# (either or both) runs without those tiers, their tests deselected on purpose and counted in the
# summary (tests/conftest.py, which also fails them, not skips, when their dependency is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import xdist" 2>/dev/null \
  || [ ! -x "${TUNER_ENGINES_DIR:-.engines}/vllm/bin/python" ] \
  || { [ "${TUNER_SKIP_SGLANG:-0}" != 1 ] && [ ! -x "${TUNER_ENGINES_DIR:-.engines}/sglang/bin/python" ]; }; then
  scripts/setup.sh
fi

export TUNER_SKIP_TIERS="${TUNER_SKIP_TIERS:-}"
skip=",${TUNER_SKIP_TIERS// /},"
for tier in ${TUNER_SKIP_TIERS//,/ }; do
  case "$tier" in
    postgres | browser) ;;
    *) echo "test: TUNER_SKIP_TIERS names an unknown tier '$tier' (known: postgres, browser)" >&2; exit 2 ;;
  esac
done
wants() { [[ "$skip" != *",$1,"* ]]; }

# lacking: sets packages, tiers and names to what the tiers still wanted lack here
lacking() {
  packages=() tiers=() names=()
  if wants postgres && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    packages+=(postgresql) tiers+=(postgres) names+=("PostgreSQL's initdb (/usr/lib/postgresql/*/bin/initdb)")
  fi
  if wants browser && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
    packages+=(chromium chromium-driver) tiers+=(browser)
    names+=("Chromium/chromedriver (/usr/bin/chromium, /usr/bin/chromedriver)")
  fi
}

lacking
if [ ${#packages[@]} -gt 0 ]; then
  why="still missing after apt-get install"
  if [ "$(id -u)" != 0 ]; then
    why="not root"
  elif ! command -v apt-get >/dev/null; then
    why="no apt-get"
  else
    echo "test: installing ${packages[*]} from Debian's packages" >&2
    log=$(mktemp /tmp/tuner-apt.XXXXXX.log)
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"; } >"$log" 2>&1; then
      why="apt-get install failed, see $log"
    fi
    lacking
  fi
  if [ ${#packages[@]} -gt 0 ]; then
    missing=$(printf '%s and ' "${names[@]}")
    echo "test: missing ${missing% and }; cannot install ($why): install Debian's ${packages[*]}," \
      "or set TUNER_SKIP_TIERS=$(IFS=,; echo "${tiers[*]}") to run without those tests" >&2
    exit 1
  fi
fi

# Test files run in parallel worker processes, each file whole in one worker (its module fixtures, such as
# a study or a server, are built once): most of the suite waits on engines, sockets and step clocks rather
# than on the CPU. TUNER_TEST_WORKERS=0 runs in this process alone (as pytest does without -n).
workers=(-n "${TUNER_TEST_WORKERS:-4}" --dist loadfile)
if wants postgres; then
  # a throwaway PostgreSQL on loopback for the storage tests (scripts/with-postgres.sh)
  scripts/with-postgres.sh .venv/bin/python -m pytest "${workers[@]}" "$@"
else
  .venv/bin/python -m pytest "${workers[@]}" "$@"
fi
