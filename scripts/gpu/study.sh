#!/usr/bin/env bash
# Start the study on the H200, from the repository copy, as a copy of scripts/gpu (a running bash
# script must not be rewritten by the next call's sync of the working tree):
#   cp -r scripts/gpu /root/state/study-scripts
#   [STUDY_DB=reports/gpu-h200/rag-h200.db] [OOM=0] [FINALISTS=1 REPEATS=3] \
#     setsid nohup bash /root/state/study-scripts/study.sh TIMEOUT_S [CONCURRENCY] [TRIALS] > /root/state/study.log 2>&1 &
# Unpacks the carried `git archive HEAD` (.gpubundle/tuner-head.tar.gz; else copies the working tree)
# into $RUN at once, waits for setup.sh and the models, starts sidecar.py (and oom.py unless OOM=0)
# beside it, then runs `tuner search` (output to $STUDY/search.log; --timeout stops starting trials
# TIMEOUT_S after this script started). To resume a study brought back into the repository, give
# STUDY_DB (a path in the repository copy): it is copied to $STUDY/rag-h200.db first, and
# `tuner search` on the same --study and --storage keeps the trials already recorded.
set -uo pipefail
REPO=$(pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
TIMEOUT_S=${1:?timeout in seconds}
CONC=${2:-16}
TRIALS=${3:-60}
log() { echo "[$(date +%T)] $*"; }
rm -rf "$RUN"; mkdir -p "$RUN"
if [ -f "$REPO/.gpubundle/tuner-head.tar.gz" ]; then
  # `git archive HEAD` carried beside the pieces: a committed tuner, not a tree another engineer
  # is editing right now; plus this study's search space
  tar -xzf "$REPO/.gpubundle/tuner-head.tar.gz" -C "$RUN"
  cp "$REPO/search_spaces/gpu-h200.yaml" "$RUN/search_spaces/"
  log "tuner: git archive HEAD ($(cat "$REPO/.gpubundle/tuner-head.commit" 2>/dev/null))"
else
  tar -C "$REPO" --exclude=./.gpubundle --exclude=./studies -cf - . | tar -C "$RUN" -xf -
  log "tuner: the working tree"
fi
started=$(date +%s)
log "waiting for setup and models"
until [ -f "$STATE/setup.done" ] && [ -f "$MODELS/DONE" ]; do
  for f in bundle tuner vllm sglang models; do [ -f "$STATE/$f.failed" ] && { log "$f failed"; exit 1; }; done
  sleep 2
done
for f in tuner vllm sglang; do [ -f "$STATE/$f.ok" ] || { log "$f not ok"; exit 1; }; done
left=$(( TIMEOUT_S - ($(date +%s) - started) ))
log "ready; tuner --timeout $left s"
STORAGE="sqlite:///$STUDY/rag-h200.db"
if [ -n "${STUDY_DB:-}" ] && [ ! -f "$STUDY/rag-h200.db" ]; then
  cp "$REPO/$STUDY_DB" "$STUDY/rag-h200.db" && log "resuming $STUDY_DB"
fi
rm -f "$CAPTURES/STOP"
setsid nohup "$PY" "$HERE/sidecar.py" "$CAPTURES" "$CAPTURES/STOP" > "$CAPTURES/sidecar.log" 2>&1 < /dev/null &
echo $! > "$STATE/sidecar.pid"
if [ "${OOM:-1}" = 1 ]; then
  PYTHONPATH="$PYDEPS/tuner" setsid nohup "$PY" "$HERE/oom.py" "$STORAGE" rag-h200 "$RUN/studies/logs/rag-h200" 60 \
    > "$CAPTURES/oom.log" 2>&1 < /dev/null &
  echo $! > "$STATE/oom.pid"
fi
cd "$RUN"
echo "$(date +%s)" > "$STATE/search.start"
PYTHONPATH="$PYDEPS/tuner:$RUN" "$PY" -m tuner search --workload rag --space search_spaces/gpu-h200.yaml \
  --model "$MODELS/target" --draft-model "$MODELS/draft-2l" \
  --engine-env "vllm=$ENGINES/vllm" --engine-env "sglang=$ENGINES/sglang" \
  --study rag-h200 --storage "$STORAGE" --concurrency "$CONC" --requests $(( 10 * CONC )) \
  --trials "$TRIALS" --finalists "${FINALISTS:-0}" --repeats "${REPEATS:-0}" --timeout "$left" > "$STUDY/search.log" 2>&1 &
echo $! > "$STATE/search.pid"
wait $!
rc=$?
log "tuner search exited $rc"
echo $rc > "$STATE/search.rc"
touch "$CAPTURES/STOP"
