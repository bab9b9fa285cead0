#!/usr/bin/env bash
# End the study cleanly before the lease ends: SIGTERM to `tuner search` (it marks the running trial
# failed and stops the engine's process group), wait for it, stop the sidecars, then poll.sh 0.
set -uo pipefail
. "$(dirname "$0")/common.sh"
require_block
if [ -f "$STATE/search.pid" ] && kill -0 "$(cat "$STATE/search.pid")" 2>/dev/null; then
  kill -TERM "$(cat "$STATE/search.pid")"
  for _ in $(seq 1 60); do kill -0 "$(cat "$STATE/search.pid")" 2>/dev/null || break; sleep 1; done
fi
touch "$CAPTURES/STOP"
for p in oom sidecar; do [ -f "$STATE/$p.pid" ] && kill "$(cat "$STATE/$p.pid")" 2>/dev/null; done
sleep 2
bash "$(dirname "$0")/poll.sh" 0
