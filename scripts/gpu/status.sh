#!/usr/bin/env bash
# One screen of where the machine stands: pieces, installs, models, study, GPU memory.
. "$(dirname "$0")/common.sh"
echo "pieces: $(ls "$BUNDLE/pieces" 2>/dev/null | tr '\n' ' ')"
echo "markers: $(cd "$STATE" && ls *.ok *.failed *.done 2>/dev/null | tr '\n' ' ')"
[ -f "$MODELS/DONE" ] && echo "models: $(tail -1 "$STATE/models.log") $(du -sh "$MODELS" | cut -f1)" \
  || { echo "models: not yet"; tail -3 "$STATE/models.log" 2>/dev/null; }
echo "--- setup.log"; tail -6 "$STATE/setup.log" 2>/dev/null
if [ -f "$STUDY/search.log" ]; then echo "--- search.log"; tail -15 "$STUDY/search.log"; fi
nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv,noheader 2>/dev/null
df -h "$ROOT" | tail -1
