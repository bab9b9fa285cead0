#!/usr/bin/env bash
# Start the study on the H200, from the repository copy, as a copy of scripts/gpu (a running bash
# script must not be rewritten by the next call's sync of the working tree):
#   cp -r scripts/gpu /root/state/study-scripts
#   [STUDY_NAME=rag-h200-capacity] [STUDY_DB=reports/gpu-h200/capacity/rag-h200-capacity.db] [OOM=0] \
#     [OBJECTIVE=capacity-pareto] [SAMPLER=tpe] [REQUESTS=200] [FINALISTS=0 REPEATS=0] [STRESS=0] [VERIFY=0] [ENGINES_ONLY=vllm] \
#     setsid nohup bash /root/state/study-scripts/study.sh TIMEOUT_S [TRIALS] > /root/state/study.log 2>&1 &
# Unpacks the carried `git archive HEAD` (.gpubundle/tuner-head.tar.gz; else copies the working tree)
# into $RUN at once, waits for setup.sh and the models, starts sidecar.py (and oom.py if OOM=1)
# beside it, then runs `tuner search` (output to $STUDY/search.log; --timeout stops starting trials
# TIMEOUT_S after this script started). The study is $STUDY/$STUDY_NAME.db. To resume a study
# brought back into the repository, give STUDY_DB (a path in the repository copy): it is copied
# there first, and `tuner search` on the same --study and --storage keeps the trials already
# recorded (--trials is the study's budget of booted trials, not this run's).
#
# The capacity study (issue 18): --objective capacity-pareto (each trial searches the highest
# Poisson rate meeting the rag preset's interactive and relaxed GPU tiers), both generated drafts and
# both generated heads (EAGLE-3, EAGLE; make_models.py writes them beside the drafts),
# a pool of REQUESTS prompts so the rate steps send distinct prompts, no closed-loop --concurrency.
# The engines' compile caches (vLLM's torch.compile, inductor, triton, FlashInfer's and SGLang's JIT
# kernels) live under $CACHE (common.sh, export_caches), so every trial of a lease after the first of
# its engine reuses them, and so does the study's next block (begin.sh unpacks what poll.sh packed).
# ENGINES_ONLY (e.g. vllm, or vllm,sglang) passes `--engines ENGINES_ONLY`, so the study boots only
# those engines; unset, no --engines is passed and the space's engines are searched (as before).
set -uo pipefail
REPO=$(pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
TIMEOUT_S=${1:?timeout in seconds}
TRIALS=${2:-12}
NAME=${STUDY_NAME:-rag-h200-capacity}
DB=$STUDY/$NAME.db
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
left=$(( TIMEOUT_S - ($(date +%s) - started) )); [ "$left" -ge 1 ] || left=1  # --timeout must be above 0
log "ready; tuner --timeout $left s"
STORAGE="sqlite:///$DB"
echo "$NAME" > "$STATE/study.name"
if [ -n "${STUDY_DB:-}" ] && [ ! -f "$DB" ]; then
  cp "$REPO/$STUDY_DB" "$DB" && log "resuming $STUDY_DB"
fi
rm -f "$CAPTURES/STOP"
setsid nohup "$PY" "$HERE/sidecar.py" "$CAPTURES" "$CAPTURES/STOP" > "$CAPTURES/sidecar.log" 2>&1 < /dev/null &
echo $! > "$STATE/sidecar.pid"
if [ "${OOM:-0}" = 1 ]; then
  PYTHONPATH="$PYDEPS/tuner" setsid nohup "$PY" "$HERE/oom.py" "$STORAGE" "$NAME" "$RUN/studies/logs/$NAME" 60 \
    > "$CAPTURES/oom.log" 2>&1 < /dev/null &
  echo $! > "$STATE/oom.pid"
fi
cd "$RUN"
echo "$(date +%s)" > "$STATE/search.start"
export_caches
STRESS_FLAG=(); [ "${STRESS:-0}" = 1 ] || STRESS_FLAG=(--no-stress)
VERIFY_FLAG=(); [ "${VERIFY:-0}" = 1 ] && VERIFY_FLAG=(--verify)  # each tier's winner, by the engine's own client
ENGINES_FLAG=(); [ -z "${ENGINES_ONLY:-}" ] || ENGINES_FLAG=(--engines "$ENGINES_ONLY")
# the sampler is named, not left to the tuner's default: study 1 samples with TPE, the default at its tag
# (gpu-study-1), and main's default for the capacity objectives has since become the performance model
log "tuner search --study $NAME --trials $TRIALS --timeout $left --requests ${REQUESTS:-200} --objective ${OBJECTIVE:-capacity-pareto} --sampler ${SAMPLER:-tpe} --finalists ${FINALISTS:-0} --repeats ${REPEATS:-0} ${STRESS_FLAG[*]} ${ENGINES_FLAG[*]} ${VERIFY_FLAG[*]}"
PYTHONPATH="$PYDEPS/tuner:$RUN" "$PY" -m tuner search --workload rag --space search_spaces/gpu-h200.yaml \
  --model "$MODELS/target" --draft-model "$MODELS/draft-2l" --draft-model "$MODELS/draft-1l" \
  --draft-model "$MODELS/eagle3-head" --draft-model "$MODELS/eagle-head" \
  --engine-env "vllm=$ENGINES/vllm" --engine-env "sglang=$ENGINES/sglang" \
  --study "$NAME" --storage "$STORAGE" --objective "${OBJECTIVE:-capacity-pareto}" --requests "${REQUESTS:-200}" \
  --trials "$TRIALS" --finalists "${FINALISTS:-0}" --repeats "${REPEATS:-0}" "${STRESS_FLAG[@]}" "${ENGINES_FLAG[@]}" \
  "${VERIFY_FLAG[@]}" \
  --sampler "${SAMPLER:-tpe}" \
  --timeout "$left" > "$STUDY/search.log" 2>&1 &
echo $! > "$STATE/search.pid"
wait $!
rc=$?
log "tuner search exited $rc"
echo $rc > "$STATE/search.rc"
touch "$CAPTURES/STOP"
