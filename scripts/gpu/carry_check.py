#!/usr/bin/env python3
"""Will every call of a block fit what one device call carries?

A device call copies the working tree (the tracked files on disk, and untracked files git does not
ignore; a block runs with the tree slimmed by ``slim.sh on``) and adds the paths it carries: a bundle
piece, or the study tag's archive. Over the limit, the call is refused before it runs. On 2026-12-05
(block 4 of study 1) the tree had grown to 45 MiB, every 24 MiB piece was refused, and a whole lease
went by with setup waiting for pieces that never came
(reports/gpu-h200/study-1/block4/NOTES.md). This check runs before a block's calls are sent
(``bundle.sh`` and ``archive.sh`` end with it) and in the unit tests, so a growing tree fails here,
not on the GPU.

Usage: scripts/gpu/carry_check.py [PIECE_BYTES]   (default: bundle.sh's PIECE; exit 1 when a call would not fit)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
# What one device call may carry, the working tree included (the device tool's limit).
CALL_LIMIT_BYTES = 64 * MIB
# Kept free for what a block adds to the tree between the check and the calls (the study file grows
# by a trial's rows; a session may write notes).
MARGIN_BYTES = 4 * MIB
REPO = Path(__file__).resolve().parents[2]
BUNDLE_SH = REPO / "scripts" / "gpu" / "bundle.sh"
BUNDLE = REPO / ".gpubundle"
ARCHIVE = BUNDLE / "tuner-head.tar.gz"  # archive.sh TAG's: what capacity_check.sh runs
STAGES_SH = REPO / "scripts" / "gpu" / "stages.sh"
PIECES = REPO / ".gpubundle" / "pieces"
CACHE_PACKS = "engine-cache-*.tar.gz"  # scripts/gpu/caches.sh's packs, one per study (common.sh, cache_pack)


def piece_bytes() -> int:
    """bundle.sh's piece size: its default, ``PIECE=${PIECE:-N}``."""
    found = re.search(r"^PIECE=\$\{PIECE:-(\d+)\}", BUNDLE_SH.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"carry_check: no PIECE=${{PIECE:-N}} default in {BUNDLE_SH}")
    return int(found.group(1))


def tree_bytes(repo: Path = REPO) -> int:
    """The bytes a call copies before it carries anything, with the tree slimmed (``slim.sh on``, as the
    RUNBOOK has it during a block): the tracked files a slim tree holds, and untracked files that git
    does not ignore, as they are on disk now."""
    tracked = subprocess.run([str(repo / "scripts" / "gpu" / "slim.sh"), "files"], check=True, capture_output=True)
    return _bytes(repo, set(tracked.stdout.decode().splitlines()) | _listed(repo, "--others", "--exclude-standard"))


def on_disk_bytes(repo: Path = REPO) -> int:
    """The tree as a call would copy it now: slim or not, whatever tracked files are on disk."""
    return _bytes(repo, _listed(repo, "--cached", "--others", "--exclude-standard"))


def _listed(repo: Path, *which: str) -> set[str]:
    """``git ls-files`` of ``which`` kinds of file."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", *which], check=True, capture_output=True)
    return {p for p in listed.stdout.decode().split("\0") if p}


def _bytes(repo: Path, paths: set[str]) -> int:
    """The size of those of ``paths`` that are files on disk."""
    return sum((repo / p).stat().st_size for p in paths if (repo / p).is_file())


def cache_packs(bundle: Path = BUNDLE) -> list[Path]:
    """The engine compile caches kept from the studies' last blocks, which both begin.sh calls of a
    block carry beside the stages' archives (plan_block.py)."""
    return sorted(bundle.glob(CACHE_PACKS))


def stage_archives() -> list[str]:
    """Every stage's archive and its commit, as repository paths that call 1 carries: stages.sh's
    ``STAGES`` and ``stage_archive``, read from the script as the device sources it."""
    text = STAGES_SH.read_text()
    stages = re.search(r"^STAGES=\(([^)]*)\)", text, re.MULTILINE)
    archive = re.search(r'^stage_archive\(\) \{ echo "([^"]*)\$1([^"]*)"; \}', text, re.MULTILINE)
    if stages is None or archive is None:
        raise SystemExit(f"carry_check: no STAGES=(...) or stage_archive() {{ echo ...; }} in {STAGES_SH}")
    paths = []
    for stage in stages.group(1).split():
        path = f"{archive.group(1)}{stage}{archive.group(2)}"
        paths += [path, path.removesuffix(".tar.gz") + ".commit"]
    return paths


def stage_archive_bytes(repo: Path = REPO) -> int:
    """The bytes of the stages' archives built so far (``stage_archives``): what call 1 carries
    before any engine cache."""
    return _bytes(repo, set(stage_archives()))


def carries(piece: int | None) -> dict[str, int]:
    """What each kind of call adds to the tree: the largest piece (``piece`` where given, else as
    built, else as bundle.sh will cut it) and, where built, call 1's stage archives (else a single
    tag's archive) with the engine caches begin.sh carries beside them."""
    built = [p.stat().st_size for p in PIECES.glob("p.*")] if PIECES.is_dir() else []
    out = {"largest piece": piece if piece is not None else max(built, default=piece_bytes())}
    staged = stage_archive_bytes()
    archives = staged or (ARCHIVE.stat().st_size if ARCHIVE.is_file() else 0)
    if archives:
        caches = sum(f.stat().st_size for f in cache_packs())
        what = "stage archives" if staged else "tag archive"
        out[f"{what} and engine caches" if caches else what] = archives + caches
    return out


def main(argv: list[str]) -> int:
    piece = int(argv[1]) if len(argv) > 1 else None
    tree = tree_bytes()
    room = CALL_LIMIT_BYTES - MARGIN_BYTES
    ok = True
    for what, size in carries(piece).items():
        total = tree + size
        fits = total <= room
        ok &= fits
        print(f"carry_check: slim working tree {tree / MIB:.1f} MiB + {what} {size / MIB:.1f} MiB = "
              f"{total / MIB:.1f} MiB of {room / MIB:.0f} MiB (64 less a {MARGIN_BYTES // MIB} MiB margin): "
              f"{'fits' if fits else 'DOES NOT FIT: cut PIECE in bundle.sh or slim the tree (slim.sh)'}")  # fmt: skip
    now = on_disk_bytes()
    if now > tree + MIB:
        print(f"carry_check: the tree on disk is {now / MIB:.1f} MiB, not slim: run scripts/gpu/slim.sh on "
              "before a block's calls, or its piece calls are refused")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
