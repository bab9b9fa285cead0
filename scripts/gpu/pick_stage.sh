#!/usr/bin/env bash
# In a block's call 1 (begin.sh), on the device: which study this card resumes and at which stage,
# from the study file in the repository copy, before anything is set up. It puts that stage's carried
# archive where setup and study.sh read the tag's code (.gpubundle/tuner-head.tar.gz and .commit) and
# writes $STATE/block.env: the stage's search settings (stage_env, kept for the polls' restarts) and
# BLOCK_STUDY / BLOCK_DB, the card's study. Exit 0 when picked; else it says why in $STATE/not-h200 and
# exits 1 where nothing may start on this machine (neither card, the study file unreadable, the card's
# study done), 2 where call 1 did not carry the stage's archive (sent again with it, it may).
#   bash scripts/gpu/pick_stage.sh
set -uo pipefail
. "$(dirname "$0")/common.sh"
refuse() { echo "$1" | tee "$STATE/not-h200"; exit "${2:-1}"; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${GPU:-none}"
case "$GPU" in  # one study per card: no trial of one card enters the other's file
  *H200*) NAME=rag-h200-study-1; DB=reports/gpu-h200/study-1/rag-h200-study-1.db ;;
  *H100*) NAME=rag-h100-study-1; DB=reports/gpu-h100/study-1/rag-h100-study-1.db ;;
  *) refuse "neither card (${GPU:-none}): nothing started" ;;
esac
STAGE=$("$PY" "$(dirname "$0")/study_stage.py" "$DB" "$NAME" "$STUDY_TRIALS" 2>&1) || refuse "$NAME: study file unreadable: $STAGE"
S=${STAGE%% *}
[ "$S" = done ] && refuse "study: $NAME done (${STAGE#* } booted trials, its verdict and every tier's verify stored): nothing to run on this card; give the machine back"
echo "study: $NAME at $STAGE booted; this block: $S ($(stage_tag "$S"))"
ARCHIVE=$(stage_archive "$S")
[ -n "$(stage_tag "$S")" ] && [ -f "$ARCHIVE" ] \
  || refuse "no $ARCHIVE carried for $NAME's $S stage: nothing started (scripts/gpu/archive.sh stages, then plan_block.py's call 1 again)" 2
cp "$ARCHIVE" .gpubundle/tuner-head.tar.gz
cp "${ARCHIVE%.tar.gz}.commit" .gpubundle/tuner-head.commit 2>/dev/null || echo unknown > .gpubundle/tuner-head.commit
printf 'export %s\nBLOCK_STUDY=%s BLOCK_DB=%s\n' "$(stage_env "$S")" "$NAME" "$DB" > "$STATE/block.env"
cat "$STATE/block.env"
