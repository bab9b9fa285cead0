#!/usr/bin/env bash
# Generate the Llama-3.1-8B-shaped target and its agreeing drafts on the GPU (real weights), with
# the tuner's own generator and corpus (copied to $STATE by recv.sh), into $MODELS.
set -uo pipefail
. "$(dirname "$0")/common.sh"
start=$(date +%s)
rm -rf "$MODELS.tmp"; mkdir -p "$(dirname "$MODELS")"
if "$PY" "$STATE/make_models.py" "$STATE/corpus.txt" "$MODELS.tmp" --shape llama-8b --device cuda; then
  rm -rf "$MODELS"; mv "$MODELS.tmp" "$MODELS"
  echo "generated in $(( $(date +%s) - start )) s"
else
  touch "$STATE/models.failed"; echo "generation failed after $(( $(date +%s) - start )) s"
fi
