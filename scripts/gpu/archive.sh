#!/usr/bin/env bash
# The study's code for the device, as `git archive` of a tag: the archive leaves out slim.sh's bulk,
# reports/ and tests/benchmarks/data/ (tens of MiB that no block reads: study.sh resumes the study file
# from the working tree), so call 1 of a block stays inside what a device call carries; carry_check.py
# says so.
#   scripts/gpu/archive.sh stages   both stages' archives, .gpubundle/stage-STAGE.tar.gz and .commit
#                                   (stages.sh), which every block's call 1 carries (plan_block.py)
#   scripts/gpu/archive.sh [TAG]    one tag (default gpu-study-1) as .gpubundle/tuner-head.tar.gz and
#                                   .commit, what capacity_check.sh runs
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/stages.sh
mkdir -p .gpubundle
mapfile -t bulk < <(scripts/gpu/slim.sh pathspec)
one() {  # TAG ARCHIVE
  git archive --format=tar.gz -o "$2" "$1" -- . "${bulk[@]}"
  git rev-parse --short "$1" > "${2%.tar.gz}.commit"
  echo "archive: $1 ($(cat "${2%.tar.gz}.commit")) as $2, $(du -h "$2" | cut -f1)"
}
if [ "${1:-}" = stages ]; then
  for s in "${STAGES[@]}"; do one "$(stage_tag "$s")" "$(stage_archive "$s")"; done
else
  one "${1:-gpu-study-1}" .gpubundle/tuner-head.tar.gz
fi
python3 scripts/gpu/carry_check.py
