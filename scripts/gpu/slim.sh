#!/usr/bin/env bash
# The working tree a block's calls carry, slimmed. Every device call copies the working tree, but only
# the files on disk: a file a sparse checkout leaves out does not travel (seen on 2026-12-05,
# reports/gpu-h200/study-1/slim-probe/NOTES.md). Most of the tree is benchmark tables and reports that
# no block reads, so a slim tree leaves each call room for a larger bundle piece: fewer calls a block.
# Usage: scripts/gpu/slim.sh on | off | files | pathspec
#   on        sparse checkout of what a block reads (before a block's message)
#   off       the whole tree back (after the block's notes are written; tests and benchmarks need it)
#   files     the tracked files a slim tree holds (carry_check.py sizes the calls by them)
#   pathspec  git's pathspec for the tree without the bulk (archive.sh's `git archive`)
set -euo pipefail
cd "$(dirname "$0")/../.."
BULK=(reports tests/benchmarks/data)   # what no block reads...
# ...but the study file and its notes, which each block resumes, and the report the optional
# bench_proposal call of a block writes a section of
KEPT=(reports/gpu-h200/study-1 reports/gpu-h100/study-1 reports/model-sampler.md reports/model_proposal.json)
pathspec() { for p in "${BULK[@]}"; do printf ':!%s\n' "$p"; done; }
case "${1:-}" in
  on)
    patterns=('/*')
    for p in "${BULK[@]}"; do patterns+=("!/$p/"); done
    for p in "${KEPT[@]}"; do patterns+=("/$p"); done
    git sparse-checkout set --no-cone "${patterns[@]}"
    echo "slim: on, $(git ls-files -t | grep -c '^S') tracked files left out; scripts/gpu/slim.sh off brings them back"
    python3 scripts/gpu/carry_check.py ;;
  off) git sparse-checkout disable; echo "slim: off" ;;
  files) { mapfile -t spec < <(pathspec); git ls-files -- . "${spec[@]}"; git ls-files -- "${KEPT[@]}"; } ;;
  pathspec) pathspec ;;
  *) echo "usage: scripts/gpu/slim.sh on | off | files | pathspec" >&2; exit 2 ;;
esac
