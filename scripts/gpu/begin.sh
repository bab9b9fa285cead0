#!/usr/bin/env bash
# Call 1 of a block (reports/gpu-h200/study-1/RUNBOOK.md), run from the repository copy with the tag's
# archive carried: marks this machine as the block's ($STATE/lease.start, which the block's later calls
# require), reads the card, and on an H200 or an H100 starts setup (recv.sh) and resumes that card's
# study in the background (study.sh), no trial starting after T seconds:
#   bash scripts/gpu/begin.sh T
# On any other card nothing starts, and block_poll.sh answers `skip`. FINALISTS and REPEATS (0 unless
# given: a sampling block), STRESS and VERIFY (study.sh) are the block's; they are kept in
# $STATE/block.env, so that a poll's restart of the search runs the same stage.
set -uo pipefail
. "$(dirname "$0")/common.sh"
T=${1:?usage: begin.sh T (seconds after which no trial may start)}
# Sent twice: alone first (the block's start, in place of a probe), then again at the head of the
# pieces' message, where it does nothing if the first one's machine is still held and starts the block
# on a fresh one if that machine went back in between.
if [ -f "$STATE/lease.start" ]; then
  echo "begun on this machine $(( $(date +%s) - $(cat "$STATE/lease.start") )) s ago: nothing started again"
  [ -f "$STATE/not-h200" ] || bash "$(dirname "$0")/status.sh"
  exit 0
fi
date +%s > "$STATE/lease.start"
rm -f "$STATE/not-h200"  # a stage mismatch's, from an earlier call 1 on this machine (below)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${GPU:-none}"
case "$GPU" in  # one study per card: no trial of one card enters the other's file
  *H200*) NAME=rag-h200-study-1; DB=reports/gpu-h200/study-1/rag-h200-study-1.db ;;
  *H100*) NAME=rag-h100-study-1; DB=reports/gpu-h100/study-1/rag-h100-study-1.db ;;
  *) echo "neither card (${GPU:-none}): nothing started" | tee "$STATE/not-h200"; exit 0 ;;
esac
# The block's stage must be its card study's: a finalists block (FINALISTS > 0, the finalists' tag
# carried) on a card whose study still samples would sample it from the wrong tag, and a sampling block
# on a study done sampling has nothing to run. study_stage.py reads the study file before any setup.
STAGE=$("$PY" "$(dirname "$0")/study_stage.py" "$DB" "$NAME" "$STUDY_TRIALS" 2>&1) || STAGE="unreadable: $STAGE"
WANT=sampling; [ "${FINALISTS:-0}" -gt 0 ] && WANT=finalists
echo "study: $NAME at $STAGE booted; this block: $WANT"
# On a mismatch this machine is not marked as begun: the later calls of this message answer skip (the
# marker), and call 1 of this card's stage, sent next while the machine is held, begins here instead
# of waiting for another machine (session 47 gave back an H100 that way: its second call 1 found the
# mismatched one's mark).
if [ "${STAGE%% *}" != "$WANT" ]; then
  THEIRS=gpu-study-1; [ "${STAGE%% *}" = finalists ] && THEIRS=gpu-study-1-finalists
  echo "stage mismatch: $NAME is at ${STAGE%% *}, the block carries the $WANT stage: nothing started; within about 30 s (the machine is held while not idle longer) run scripts/gpu/archive.sh $THEIRS and send that stage's call 1 (plan_block.py$([ "${STAGE%% *}" = finalists ] && echo " --finalists")) with the same kind: it begins on this machine (RUNBOOK, \"Two studies, one per card\")" | tee "$STATE/not-h200"
  rm -f "$STATE/lease.start"
  exit 0
fi
printf 'export FINALISTS=%s REPEATS=%s STRESS=%s VERIFY=%s\n' "${FINALISTS:-0}" "${REPEATS:-0}" "${STRESS:-0}" \
  "${VERIFY:-0}" > "$STATE/block.env"
cat "$STATE/block.env"
bash "$(dirname "$0")/caches.sh" unpack ".gpubundle/$(cache_pack "$NAME")"  # this study's last block's
bash "$(dirname "$0")/recv.sh"
# study.sh runs from a copy: a running bash script must not be rewritten by the next call's sync
rm -rf "$STATE/study-scripts"; cp -r "$(dirname "$0")" "$STATE/study-scripts"
: > "$STATE/study.log"
start_study "$T" STUDY_NAME="$NAME" STUDY_DB="$DB"
sleep 2
cat "$STATE/study.log"
