#!/usr/bin/env bash
# The study's code for the device: `git archive TAG` (default gpu-study-1) as .gpubundle/tuner-head.tar.gz,
# with its commit in .gpubundle/tuner-head.commit. The archive leaves out slim.sh's bulk, reports/ and
# tests/benchmarks/data/ (tens of MiB that no block reads: study.sh resumes the study file from the
# working tree), so call 1 of a block stays inside what a device call carries; carry_check.py says so.
# Usage: scripts/gpu/archive.sh [TAG]
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${1:-gpu-study-1}
mkdir -p .gpubundle
mapfile -t bulk < <(scripts/gpu/slim.sh pathspec)
git archive --format=tar.gz -o .gpubundle/tuner-head.tar.gz "$TAG" -- . "${bulk[@]}"
git rev-parse --short "$TAG" > .gpubundle/tuner-head.commit
echo "archive: $TAG ($(cat .gpubundle/tuner-head.commit)), $(du -h .gpubundle/tuner-head.tar.gz | cut -f1)"
python3 scripts/gpu/carry_check.py
