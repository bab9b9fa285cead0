#!/usr/bin/env bash
# In a device call: wait up to WAIT_S seconds (less if the study ends), then copy the study (a
# consistent SQLite backup, $STUDY_NAME.db: the name study.sh recorded in $STATE/study.name, else
# STUDY_NAME, else rag-h200-capacity), its search.log and a tar.gz of the trial logs, setup logs and
# captures into $OUT; and once a boot has ended, the engines' compile caches for the study's next
# block (caches.sh pack).
#   bash scripts/gpu/poll.sh WAIT_S
set -uo pipefail
. "$(dirname "$0")/common.sh"
require_block
WAIT_S=${1:-0}
end=$(( $(date +%s) + WAIT_S ))
while [ "$(date +%s)" -lt "$end" ]; do
  [ -f "$STATE/search.rc" ] && break
  sleep 5
done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NAME=$(cat "$STATE/study.name" 2>/dev/null || echo "${STUDY_NAME:-rag-h200-capacity}")
if [ -f "$STUDY/$NAME.db" ]; then
  "$PY" -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" \
    "$STUDY/$NAME.db" "$OUT/$NAME.db"
fi
cp "$STUDY/search.log" "$OUT/" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$ROOT" --exclude='*.safetensors' \
  $(cd "$ROOT" && ls -d run/studies/logs state/*.log state/*.probe state/study.log captures models/h200/DONE models/h200/target/config.json 2>/dev/null) 2>/dev/null
OUT="$OUT" bash "$(dirname "$0")/caches.sh" pack "$NAME"
ls -la "$OUT"
bash "$(dirname "$0")/status.sh"
