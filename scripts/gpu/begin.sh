#!/usr/bin/env bash
# Call 1 of a block (reports/gpu-h200/study-1/RUNBOOK.md), run from the repository copy with both
# stages' archives carried (archive.sh stages): marks this machine as the block's ($STATE/lease.start,
# which the block's later calls require), picks the study of the card it got and that study's stage
# (pick_stage.sh), and starts setup (recv.sh) and that study's search in the background (study.sh),
# no trial starting after T seconds:
#   bash scripts/gpu/begin.sh T
# Where nothing may start (neither card, or the stage's archive not carried), block_poll.sh answers
# `skip`. The stage's settings are kept in $STATE/block.env, so that a poll's restart of the search
# runs the same stage.
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
rm -f "$STATE/not-h200"  # an earlier call 1's on this machine, whose archives were missing (below)
bash "$(dirname "$0")/pick_stage.sh"; picked=$?
if [ "$picked" -ne 0 ]; then
  # Unmarked where the archives were missing (2), so that call 1 sent again with them, while the
  # machine is held, begins here; on neither card nothing ever may.
  [ "$picked" -eq 2 ] && rm -f "$STATE/lease.start"
  exit 0
fi
. "$STATE/block.env"
bash "$(dirname "$0")/caches.sh" unpack ".gpubundle/$(cache_pack "$BLOCK_STUDY")"  # this study's last block's
bash "$(dirname "$0")/recv.sh"
# study.sh runs from a copy: a running bash script must not be rewritten by the next call's sync
rm -rf "$STATE/study-scripts"; cp -r "$(dirname "$0")" "$STATE/study-scripts"
: > "$STATE/study.log"
start_study "$T" STUDY_NAME="$BLOCK_STUDY" STUDY_DB="$BLOCK_DB"
sleep 2
cat "$STATE/study.log"
