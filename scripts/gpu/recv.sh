#!/usr/bin/env bash
# Run from the repository copy on the H200 machine in every call that carries a bundle piece:
# moves the carried pieces out of the repo copy, starts the setup daemon once (setup.sh, from a
# copy of scripts/gpu so that later syncs of the working tree cannot change a running script),
# starts the model generation once, and prints where things stand. Only on the machine begin.sh
# marked: on a bare one (the block's went away) it answers BARE and does nothing (common.sh).
set -uo pipefail
. "$(dirname "$0")/common.sh"
[ -f "$STATE/not-h200" ] && { echo "skip: $(cat "$STATE/not-h200")"; exit 0; }  # begin.sh set nothing up here
require_block
for f in .gpubundle/pieces/*; do [ -f "$f" ] && mv -f "$f" "$BUNDLE/pieces/"; done
if [ ! -d "$STATE/scripts" ]; then cp -r scripts/gpu "$STATE/scripts"; fi
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if ! alive "$STATE/setup.pid" && [ ! -f "$STATE/setup.done" ]; then
  setsid nohup bash "$STATE/scripts/setup.sh" > "$STATE/setup.log" 2>&1 < /dev/null &
  echo $! > "$STATE/setup.pid"
fi
if ! alive "$STATE/models.pid" && [ ! -f "$MODELS/DONE" ] && [ ! -f "$STATE/models.failed" ]; then
  # the generator and corpus of the carried tag's archive where there is one (the working tree's copy may be
  # mid-edit), else the working tree's
  if [ -f .gpubundle/tuner-head.tar.gz ] && tar -xzf .gpubundle/tuner-head.tar.gz -C "$STATE" --strip-components=0 \
      tuner/engines/scripts/make_models.py tuner/workloads/corpus.txt 2>/dev/null; then
    cp "$STATE/tuner/engines/scripts/make_models.py" "$STATE/tuner/workloads/corpus.txt" "$STATE/"
    echo "models: make_models.py and corpus.txt from .gpubundle/tuner-head.tar.gz ($(cat .gpubundle/tuner-head.commit 2>/dev/null))"
  else
    cp tuner/engines/scripts/make_models.py tuner/workloads/corpus.txt "$STATE/"
  fi
  setsid nohup bash "$STATE/scripts/gen_models.sh" > "$STATE/models.log" 2>&1 < /dev/null &
  echo $! > "$STATE/models.pid"
fi
bash "$(dirname "$0")/status.sh"
