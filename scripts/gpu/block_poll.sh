#!/usr/bin/env bash
# A poll of a block (reports/gpu-h200/study-1/RUNBOOK.md): if the search has ended (its T passed
# early) while less than T seconds of the lease are gone, start it again on this machine, resuming
# the study file already here, with the block's stage (begin.sh's block.env); then poll.sh W (wait
# up to W seconds, bring back the study file and logs) and the study's last lines. The last poll
# passes T 0: no restart.
#   bash scripts/gpu/block_poll.sh T W
set -uo pipefail
. "$(dirname "$0")/common.sh"
T=${1:?usage: block_poll.sh T W}; W=${2:?usage: block_poll.sh T W}
[ -f "$STATE/not-h200" ] && { echo skip; exit 0; }
require_block
if [ -f "$STATE/search.rc" ] && [ $(( $(date +%s) - $(cat "$STATE/lease.start") )) -lt "$T" ]; then
  rm -f "$STATE/search.rc"
  start_study 60 STUDY_NAME="$(cat "$STATE/study.name")"
  echo RESTARTED
fi
bash "$(dirname "$0")/poll.sh" "$W"
date
tail -5 "$STATE/study.log"
