#!/usr/bin/env bash
# The engines' compile caches (common.sh, CACHE), carried from one block of a study to its next:
#   bash scripts/gpu/caches.sh unpack FILE   begin.sh, before setup: FILE as the block's call 1 carried it
#   bash scripts/gpu/caches.sh pack NAME     poll.sh: study NAME's caches into $OUT, in parts
# A pack is taken once a boot has ended (search.log has a trial's warmup line), and never while a
# compiler runs or with the files written in the last minute: a torn kernel would break the next
# block's boot, and a finalist's repeat that dies at boot is a failure of that finalist. A poll that
# cannot pack says why, and one whose caches are as the last pack had them brings none back: the
# parts an earlier poll brought back stand. Its parts are at most 15 MiB: the device tool brings back
# 16 MiB a file. Here, after_block.sh joins the last parts that came into .gpubundle/.
set -uo pipefail
. "$(dirname "$0")/common.sh"
QUIET_S=${CACHE_QUIET_S:-60}  # a file this many seconds unwritten is whole (unless a compiler runs)
MAX_PACK=$(( 48 << 20 ))  # three parts: with the study file and logs, inside the 64 MiB a call brings back
case "${1:-}" in
  unpack)
    FILE=${2:?usage: caches.sh unpack FILE}
    if [ ! -f "$FILE" ]; then
      echo "engine caches: none carried ($FILE); the engines compile afresh"
    elif mkdir -p "$CACHE" && tar -xzf "$FILE" -C "$CACHE"; then
      echo "engine caches: $(tar -tzf "$FILE" | grep -vc '/$') files unpacked from $FILE"
    else
      echo "engine caches: $FILE did not unpack; the engines compile afresh"
    fi ;;
  pack)
    NAME=${2:?usage: caches.sh pack NAME}
    grep -q " warmup " "$STUDY/search.log" 2>/dev/null && [ -d "$CACHE" ] || exit 0
    OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
    PACK=$(cache_pack "$NAME")
    rm -f "$OUT/$PACK".*
    if running=$(pgrep -x -l 'ninja|nvcc|cicc|ptxas|cc1plus|ld' | head -1) && [ -n "$running" ]; then
      echo "engine caches: a compiler runs ($running): not packed this poll"
      exit 0
    fi
    # what would be packed: every whole file, by path, size and time (the last pack's, in $STATE)
    (cd "$CACHE" && find . -type f ! -newermt "$(date -d "-$QUIET_S seconds" '+%Y-%m-%d %H:%M:%S')" \
      -printf '%p %s %T@\n' | sort) > "$STATE/$PACK.files"
    if [ -f "$STATE/$PACK.packed" ] && cmp -s "$STATE/$PACK.files" "$STATE/$PACK.packed"; then
      echo "engine caches: as the last pack had them: none brought back this poll"
      exit 0
    fi
    if ! (cd "$CACHE" && sed 's/ [^ ]* [^ ]*$//' "$STATE/$PACK.files" | tr '\n' '\0' \
      | tar --null -czf "$STATE/$PACK" -T -); then
      echo "engine caches: a file changed while packed: not packed this poll"
      exit 0
    fi
    cp "$STATE/$PACK.files" "$STATE/$PACK.packed"
    size=$(stat -c %s "$STATE/$PACK")
    if [ "$size" -gt "$MAX_PACK" ]; then
      echo "engine caches: $PACK is $size bytes, over $MAX_PACK: not brought back"
      exit 0
    fi
    split -d -a 1 -b 15M "$STATE/$PACK" "$OUT/$PACK."
    echo "engine caches: $PACK, $size bytes, in $(ls "$OUT/$PACK".* | wc -l) parts" ;;
  *) echo "usage: caches.sh unpack FILE | pack NAME" >&2; exit 2 ;;
esac
