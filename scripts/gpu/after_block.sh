#!/usr/bin/env bash
# Here, after a block (reports/gpu-h200/study-1/RUNBOOK.md, step 5): take in what its polls brought back.
#   bash scripts/gpu/after_block.sh FROM STUDY BLOCK [CACHES_FROM]
# FROM is the folder the last poll's files came to (/work/.device/N, the last that brought the study
# file), STUDY the card's study (rag-h100-study-1 or rag-h200-study-1), BLOCK the block's number;
# CACHES_FROM the folder of the last poll that brought the engine caches (default FROM: a poll packs
# them only once a trial warmed up, and not while a compiler runs). It
#   - copies the study file into the study's folder and search.log into blockBLOCK/,
#   - joins the caches' parts into .gpubundle/ (plan_block.py carries them in the next block),
#   - unpacks logs.tar.gz under /tmp and counts vLLM's prefix-cache resets per log (done, refused),
#   - prints `tuner trials` of the study file, with the repeats of a finalists block.
# The notes, the card's report and the commit stay the session's.
set -euo pipefail
FROM=${1:?usage: after_block.sh FROM STUDY BLOCK [CACHES_FROM]}
STUDY=${2:?usage: after_block.sh FROM STUDY BLOCK [CACHES_FROM]}
BLOCK=${3:?usage: after_block.sh FROM STUDY BLOCK [CACHES_FROM]}
CACHES_FROM=${4:-$FROM}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
case "$STUDY" in
  rag-h100-study-1) CARD=h100 ;;
  rag-h200-study-1) CARD=h200 ;;
  *) echo "after_block: $STUDY is neither card's study (rag-h100-study-1, rag-h200-study-1)" >&2; exit 2 ;;
esac
DIR=$REPO/reports/gpu-$CARD/study-1
[ -f "$FROM/$STUDY.db" ] || { echo "after_block: no $FROM/$STUDY.db: name the last poll that brought it" >&2; exit 2; }
mkdir -p "$DIR/block$BLOCK"
install -m 644 "$FROM/$STUDY.db" "$DIR/$STUDY.db"
[ -f "$FROM/search.log" ] && install -m 644 "$FROM/search.log" "$DIR/block$BLOCK/search.log"
echo "study file: $DIR/$STUDY.db; search.log: $DIR/block$BLOCK/"
PACK=engine-cache-$STUDY.tar.gz
if compgen -G "$CACHES_FROM/$PACK.*" > /dev/null; then
  mkdir -p "$REPO/.gpubundle"
  cat "$CACHES_FROM/$PACK".[0-9] > "$REPO/.gpubundle/$PACK.new"  # split's one-digit suffixes, in order
  if tar -tzf "$REPO/.gpubundle/$PACK.new" > /dev/null 2>&1; then
    mv "$REPO/.gpubundle/$PACK.new" "$REPO/.gpubundle/$PACK"
    echo "engine caches: .gpubundle/$PACK, $(stat -c %s "$REPO/.gpubundle/$PACK") bytes"
  else
    rm -f "$REPO/.gpubundle/$PACK.new"
    echo "engine caches: the parts in $CACHES_FROM do not make a whole archive: the kept ones, if any, stay"
  fi
else
  # a poll brings them back only where they changed since its last pack: name an earlier poll's folder
  earlier=$(ls -d "$(dirname "$FROM")"/*/"$PACK".0 2>/dev/null | sort -V | tail -3 | xargs -r -n1 dirname \
    | tr '\n' ' ')
  echo "engine caches: none in $CACHES_FROM (the kept ones, if any, stay)${earlier:+; folders with parts: $earlier}"
fi
if [ -f "$FROM/logs.tar.gz" ]; then
  LOGS=/tmp/after-block-$STUDY-$BLOCK
  rm -rf "$LOGS" && mkdir -p "$LOGS" && tar -xzf "$FROM/logs.tar.gz" -C "$LOGS"
  echo "logs: $LOGS"
  for log in "$LOGS"/run/studies/logs/"$STUDY"/trial-*-vllm*.log; do
    [ -f "$log" ] || continue
    done_=$(grep -c "Successfully reset prefix cache" "$log" || true)
    refused=$(grep -c "Failed to reset prefix cache" "$log" || true)
    echo "  $(basename "$log"): prefix-cache resets $done_ done, $refused refused"
  done
fi
TUNER=${TUNER:-$REPO/.venv/bin/tuner}
if [ -x "$TUNER" ]; then
  "$TUNER" trials --study "$STUDY" --storage "sqlite:///$DIR/$STUDY.db"
else
  echo "tuner trials: no $TUNER here"
fi
