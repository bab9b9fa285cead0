#!/usr/bin/env bash
# Pack the downloaded wheels (download_bundle.sh) into one tar stream, cut into pieces that fit one
# device call each (the working tree and a piece must stay under 64 MiB). The stream holds, in order:
# the tuner's dependencies and vLLM's wheels, a marker A.DONE, SGLang's other wheels, a marker B.DONE,
# so setup.sh can unpack it while the pieces arrive and install vLLM before SGLang's wheels are in.
# Writes .gpubundle/pieces/p.NN, and scripts/gpu/bundle.sha256 and scripts/gpu/wheels-{tuner,vllm,sglang}.txt,
# which travel with the working tree and tell setup.sh what to wait for and what to install.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-.gpubundle}
PIECE=${PIECE:-50331648}  # 48 MiB: a piece and the slim working tree (slim.sh) must fit one call (carry_check.py);
# 24 MiB stopped fitting when the whole tree passed 40 MiB, and 12 MiB pieces made a block 87 calls
# A set that download_bundle.sh left out (SETS="tuner vllm": no sglang) keeps its tracked wheels-*.txt
# and travels empty: the stream then holds no SGLang wheels, only the B.DONE marker after A.DONE.
for s in tuner vllm sglang; do [ ! -f "$B/sets/$s.txt" ] || cp "$B/sets/$s.txt" "scripts/gpu/wheels-$s.txt"; done
sort -u "$B/sets/tuner.txt" "$B/sets/vllm.txt" > "$B/a.list"
if [ -f "$B/sets/sglang.txt" ]; then sort -u "$B/sets/sglang.txt" | comm -23 - "$B/a.list"; fi > "$B/b.list"
echo a > "$B/wheels/A.DONE"; echo b > "$B/wheels/B.DONE"
rm -rf "$B/pieces"; mkdir -p "$B/pieces"
cat "$B/a.list" <(echo A.DONE) "$B/b.list" <(echo B.DONE) > "$B/stream.list"
# A stream of fixed metadata (times, owners, modes; the list's order): the same wheels give the same
# pieces and checksums on any machine, so the committed bundle.sha256 stays true when a fresh checkout
# downloads the wheels again.
tar -C "$B/wheels" --format=gnu --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=0644 \
  -cf - -T "$B/stream.list" | split -b "$PIECE" -d -a 2 - "$B/pieces/p."
(cd "$B/pieces" && sha256sum p.*) > scripts/gpu/bundle.sha256
ls -l "$B/pieces" | awk '{print $5, $9}' | tr '\n' ' '; echo
python3 scripts/gpu/carry_check.py
