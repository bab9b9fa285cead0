#!/usr/bin/env bash
# Run from the repository copy on the H200 machine before recv.sh, in every call that carries a
# chunk: when the repository's tree (about 4.7 MiB) no longer leaves room for a whole 61.5 MiB piece
# in one call's 64 MiB, the pieces' stream (p.00 ... p.16 in bundle.sha256's order) is re-cut here
# into 57 MiB chunks (.gpubundle/chunks/c.NN, their sums in stream.sha256, each piece's offset and
# size in stream.pieces). This script checks each carried chunk, appends the chunks to one stream
# file in order as they arrive, and cuts every piece that is complete out of it into
# $BUNDLE/pieces (with mv, so setup.sh's feed sees it whole), where setup.sh checks it as before.
# Made here, once:  cat pieces/p.* | split -b $((57*1024*1024)) -d -a 2 - chunks/c.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
SD=$ROOT/stream; mkdir -p "$SD/chunks"
for f in .gpubundle/chunks/c.*; do
  [ -f "$f" ] || continue
  n=$(basename "$f"); want=$(awk -v n="$n" '$2==n{print $1}' "$HERE/stream.sha256")
  if [ "$(sha256sum < "$f" | cut -d' ' -f1)" = "$want" ]; then mv -f "$f" "$SD/chunks/$n"; echo "chunk $n ok"
  else echo "chunk $n: checksum failed, send it again"; rm -f "$f"; fi
done
# append the next chunks in order
while read -r sum n; do
  [ -f "$SD/appended.$n" ] && continue
  [ -f "$SD/chunks/$n" ] || break
  cat "$SD/chunks/$n" >> "$SD/stream.bin" && touch "$SD/appended.$n" && rm -f "$SD/chunks/$n"
done < "$HERE/stream.sha256"
have=$(stat -c %s "$SD/stream.bin" 2>/dev/null || echo 0)
while read -r name off size; do
  [ -f "$SD/cut.$name" ] && continue
  [ $((off + size)) -le "$have" ] || break
  dd if="$SD/stream.bin" of="$SD/tmp.$name" iflag=skip_bytes,count_bytes skip="$off" count="$size" bs=4M status=none \
    && mv -f "$SD/tmp.$name" "$BUNDLE/pieces/$name" && touch "$SD/cut.$name" && echo "piece $name cut"
done < "$HERE/stream.pieces"
echo "stream: $have bytes; pieces cut: $(ls "$SD" | grep -c '^cut\.')/$(wc -l < "$HERE/stream.pieces")"
