"""Every call of a GPU block fits what one device call carries (scripts/gpu/carry_check.py).

A device call copies the working tree (the files on disk: a block runs with it slimmed, ``slim.sh on``)
and adds one bundle piece or the study tag's archive; over the limit it is refused. On 2026-12-05 the
tree had grown past what a 24 MiB piece left room for, every piece call of block 4 was refused, and the
lease went by with nothing run
(reports/gpu-h200/study-1/block4/NOTES.md). These tests fail in CI when the tree grows that far again.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import optuna
import pytest

from tests.unit.gpu_scripts import GPU_SCRIPTS, load_gpu_script
from tests.unit.study_files import H100_STUDY, H200_STUDY
from tuner.fleet.loop import boots_used
from tuner.study.attrs import SCREENED, STRESS_CHECK_KIND

ROOT = Path(__file__).resolve().parents[2]


def _slim(what: str) -> list[str]:
    done = subprocess.run([str(GPU_SCRIPTS / "slim.sh"), what], cwd=ROOT, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.splitlines()


def test_the_slim_tree_holds_what_a_block_reads_and_leaves_the_bulk_out() -> None:
    """What carry_check sizes and ``slim.sh on`` checks out: the study file, the block scripts, the
    tuner, the report the optional bench writes; no benchmark tables or other reports."""
    slim = set(_slim("files"))
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
                  .stdout.splitlines())  # fmt: skip
    for needed in ("reports/gpu-h200/study-1/rag-h200-study-1.db", "reports/gpu-h100/study-1/rag-h100-study-1.db",
                   "scripts/gpu/study.sh", "scripts/gpu/recv.sh", "scripts/gpu/study_stage.py",
                   "scripts/gpu/bundle.sha256", "search_spaces/gpu-h200.yaml", "tuner/__main__.py",
                   "tests/benchmarks/bench_proposal.py", "reports/model_proposal.json"):  # fmt: skip
        assert needed in slim, needed
    assert slim < tracked
    left_out = tracked - slim
    assert any(p.startswith("tests/benchmarks/data/") for p in left_out)
    assert all(p.startswith(("reports/", "tests/benchmarks/data/")) for p in left_out), sorted(left_out)[:5]


def test_the_tree_and_a_bundle_piece_fit_one_device_call() -> None:
    cc = load_gpu_script("carry_check")
    tree, piece = cc.tree_bytes(ROOT), cc.piece_bytes()
    assert piece >= cc.MIB, piece  # the default was read from bundle.sh, not a stray match
    assert tree + piece <= cc.CALL_LIMIT_BYTES - cc.MARGIN_BYTES, (
        f"tree {tree / cc.MIB:.1f} MiB + piece {piece / cc.MIB:.1f} MiB leaves under "
        f"{cc.MARGIN_BYTES / cc.MIB:.0f} MiB of a device call: cut PIECE in scripts/gpu/bundle.sh or shrink the tree"
    )


def test_the_check_refuses_a_piece_that_would_not_fit() -> None:
    """Not vacuous: a piece of the whole limit fails, and the script says so with exit 1."""
    cc = load_gpu_script("carry_check")
    done = subprocess.run(["python3", str(GPU_SCRIPTS / "carry_check.py"), str(cc.CALL_LIMIT_BYTES)],
                          capture_output=True, text=True, check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DOES NOT FIT" in done.stdout


def test_the_study_archive_holds_what_a_block_runs_and_leaves_the_bulk_out() -> None:
    """archive.sh's pathspec, as git applies it to HEAD: the tuner, the generator and corpus recv.sh
    takes out of it, the search space; no reports or benchmark tables (study.sh resumes the study file
    from the working tree)."""
    script = (GPU_SCRIPTS / "archive.sh").read_text()
    assert '"$1" -- . "${bulk[@]}"' in script and "slim.sh pathspec" in script
    bulk = _slim("pathspec")
    blob = subprocess.run(["git", "archive", "--format=tar", "HEAD", "--", ".", *bulk],
                          cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = set(tar.getnames())
    for needed in ("pyproject.toml", "tuner/__main__.py", "tuner/engines/scripts/make_models.py",
                   "tuner/workloads/corpus.txt", "search_spaces/gpu-h200.yaml"):  # fmt: skip
        assert needed in names, needed
    assert not any(n.startswith(("reports/", "tests/benchmarks/data/")) for n in names)


def _gpu_script(
    name: str, *args: str, root: Path, path: str | None = None, repo: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """One of a block's scripts as a device call runs it (from the repository copy ``repo``), with
    the machine's state under ``root`` instead of /root. A script that waits where it should answer
    at once fails by the timeout."""
    env = {**os.environ, "GPU_ROOT": str(root), "OUT": str(root / "out")}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(GPU_SCRIPTS / name), *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def _device_repo(tmp_path: Path, archives: bool = True) -> Path:
    """A repository copy as call 1 finds it: both cards' study files and, where ``archives``, both
    stages' archives as plan_block.py's call 1 carries them (stand-in bytes: pick_stage.sh only
    copies the one it picks)."""
    repo = tmp_path / "repo"
    for study in (H100_STUDY, H200_STUDY):
        kept = repo / study.relative_to(ROOT)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.symlink_to(study)  # read-only: study_stage.py opens it mode=ro
    (repo / ".gpubundle").mkdir()
    for stage in ("sampling", "finalists") if archives else ():
        (repo / ".gpubundle" / f"stage-{stage}.tar.gz").write_bytes(f"{stage} archive".encode())
        (repo / ".gpubundle" / f"stage-{stage}.commit").write_text(f"{stage[:7]}\n")
    return repo


def _card(tmp_path: Path, name: str) -> str:
    """A PATH whose nvidia-smi names ``name``, as the device's does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{name}'\n")
    smi.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_bare_machine_answers_every_later_call_of_a_block_at_once(tmp_path: Path) -> None:
    """In the H100 study's block 2 the machine that ran call 1 went away after the pieces; the next
    calls got a bare machine and five polls waited out their waits on a study that was not there
    (reports/gpu-h100/study-1/block2/NOTES.md). On a machine begin.sh did not mark, the pieces, the
    polls and finish.sh now do nothing and say BARE, so the message ends with its budget kept."""
    for name, args in (("recv.sh", ()), ("poll.sh", ("600",)), ("block_poll.sh", ("920", "600")), ("finish.sh", ())):
        done = _gpu_script(name, *args, root=tmp_path)
        assert done.returncode == 3, (name, done.stdout, done.stderr)
        assert done.stdout.startswith("BARE:"), (name, done.stdout)
    assert not (tmp_path / "state" / "setup.pid").exists()  # no setup started without the tag's archive


def test_begin_on_neither_card_starts_nothing_and_the_block_answers_skip(tmp_path: Path) -> None:
    """begin.sh reads the card: an H200 or an H100 resumes its own study; on any other card nothing
    is set up, and the block's later calls answer skip (not BARE: this is the block's machine)."""
    path = _card(tmp_path, "NVIDIA A100-SXM4-80GB")
    begun = _gpu_script("begin.sh", "920", root=tmp_path, path=path)
    assert begun.returncode == 0, begun.stdout + begun.stderr
    assert "GPU: NVIDIA A100-SXM4-80GB" in begun.stdout
    assert (tmp_path / "state" / "lease.start").is_file()
    assert "neither card" in (tmp_path / "state" / "not-h200").read_text()
    for name, args in (("recv.sh", ()), ("block_poll.sh", ("920", "600"))):
        done = _gpu_script(name, *args, root=tmp_path, path=path)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
        assert done.stdout.startswith("skip"), (name, done.stdout)
    assert not (tmp_path / "state" / "setup.pid").exists()
    assert not (tmp_path / "state" / "study.log").exists()
    # sent again at the head of the pieces' message (plan_block.py): the machine that ran it keeps its block
    started = (tmp_path / "state" / "lease.start").read_text()
    again = _gpu_script("begin.sh", "400", root=tmp_path, path=path)
    assert again.returncode == 0 and again.stdout.startswith("begun on this machine"), again.stdout + again.stderr
    assert (tmp_path / "state" / "lease.start").read_text() == started


def test_the_stage_read_on_the_device_counts_the_booted_trials_as_the_search_does() -> None:
    """study_stage.py runs before the tuner is installed, so it counts with sqlite3 alone; the count
    must be the search's own (``tuner.fleet.loop.boots_used``) on both study files."""
    stage = load_gpu_script("study_stage")
    assert stage.NEVER_BOOTED == {"failure": SCREENED, "config_kind": STRESS_CHECK_KIND}  # booted()'s markers
    for name, path, expected in (("rag-h100-study-1", H100_STUDY, "finalists 18"),
                                 ("rag-h200-study-1", H200_STUDY, "sampling 8")):  # fmt: skip
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{path}")
        assert stage.booted_trials(str(path), name) == boots_used(study)
        assert stage.stage(str(path), name, 18) == expected
    assert stage.stage("/nonexistent/study.db", "rag-h100-study-1", 18) == "sampling 0"
    assert stage.booted_trials(str(H100_STUDY), "another-study") == 0


@pytest.mark.parametrize(("card", "study", "stage", "settings"), [
    ("NVIDIA H100 80GB HBM3", "rag-h100-study-1", "finalists 18", "FINALISTS=1 REPEATS=3 STRESS=1 VERIFY=1"),
    ("NVIDIA H200", "rag-h200-study-1", "sampling 8", "FINALISTS=0 REPEATS=0 STRESS=0 VERIFY=0"),
])  # fmt: skip
def test_call_1_runs_the_stage_its_cards_study_is_at_from_that_stages_archive(
    tmp_path: Path, card: str, study: str, stage: str, settings: str
) -> None:
    """Call 1 carries both stages' archives and the card picks: in session 47 a sampling block's call
    1 got an H100, whose study is at its finalists, and that machine ran nothing."""
    repo, path = _device_repo(tmp_path), _card(tmp_path, card)
    carried = load_gpu_script("carry_check").stage_archives()  # what plan_block.py's call 1 carries
    assert sorted(carried) == sorted(str(f.relative_to(repo)) for f in (repo / ".gpubundle").glob("stage-*"))
    picked = _gpu_script("pick_stage.sh", root=tmp_path, path=path, repo=repo)
    assert picked.returncode == 0, picked.stdout + picked.stderr
    name = stage.split()[0]
    assert f"study: {study} at {stage} booted; this block: {name}" in picked.stdout
    env = (tmp_path / "state" / "block.env").read_text().splitlines()
    assert env == [f"export {settings}", f"BLOCK_STUDY={study} BLOCK_DB=reports/gpu-{study[4:8]}/study-1/{study}.db"]
    assert (repo / ".gpubundle" / "tuner-head.tar.gz").read_bytes() == f"{name} archive".encode()
    assert (repo / ".gpubundle" / "tuner-head.commit").read_text() == f"{name[:7]}\n"
    assert not (tmp_path / "state" / "not-h200").exists()


def test_a_study_with_its_verdict_and_every_tiers_verify_is_done_and_its_card_runs_nothing(tmp_path: Path) -> None:
    """Once the H100 study has its verdict and each tier's `tuner verify` report, a block on an H100
    would resume it only to find nothing left: call 1 says the study is done and starts nothing. A
    tier whose check stored an error is checked again, so that study is at its finalists still."""
    stage = load_gpu_script("study_stage")
    repo, path = _device_repo(tmp_path), _card(tmp_path, "NVIDIA H100 80GB HBM3")
    kept = repo / H100_STUDY.relative_to(ROOT)
    kept.unlink()
    kept.write_bytes(H100_STUDY.read_bytes())  # a copy to finish, where the fake repo linked the real file
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{kept}")
    assert stage.stage(str(kept), "rag-h100-study-1", 18) == "finalists 18", "no verdict yet"
    study.set_user_attr("verdict", {"kind": "tie", "metric": "capacity_interactive_req_s", "trials": [0, 8]})
    study.set_user_attr("verify", {"interactive": {"trial": 0}, "relaxed": {"trial": 0, "error": "boot failed"}})
    assert stage.stage(str(kept), "rag-h100-study-1", 18) == "finalists 18", "the relaxed tier is checked again"
    study.set_user_attr("verify", {"interactive": {"trial": 0}, "relaxed": {"trial": 0}})
    assert stage.stage(str(kept), "rag-h100-study-1", 18) == "done 18"
    assert stage.stage(str(H200_STUDY), "rag-h200-study-1", 18) == "sampling 8"
    begun = _gpu_script("begin.sh", "920", root=tmp_path, path=path, repo=repo)
    assert begun.returncode == 0, begun.stdout + begun.stderr
    said = (tmp_path / "state" / "not-h200").read_text()
    assert said.startswith("study: rag-h100-study-1 done (18 booted trials") and "give the machine back" in said
    assert not (tmp_path / "state" / "block.env").exists() and not (tmp_path / "state" / "study.log").exists()
    assert not (tmp_path / "state" / "setup.pid").exists()


def test_call_1_without_the_stages_archives_starts_nothing_and_leaves_the_machine_unmarked(tmp_path: Path) -> None:
    """A call 1 that did not carry its stage's archive (the older plan's, or archive.sh not run)
    starts nothing; the rest of its message answers skip, and call 1 sent again with the archives
    while the machine is held begins on it rather than answering "begun on this machine"."""
    repo, path = _device_repo(tmp_path, archives=False), _card(tmp_path, "NVIDIA H100 80GB HBM3")
    begun = _gpu_script("begin.sh", "920", root=tmp_path, path=path, repo=repo)
    assert begun.returncode == 0, begun.stdout + begun.stderr
    assert "no .gpubundle/stage-finalists.tar.gz carried" in (tmp_path / "state" / "not-h200").read_text()
    assert not (tmp_path / "state" / "lease.start").exists() and not (tmp_path / "state" / "study.log").exists()
    for name, args in (("recv.sh", ()), ("block_poll.sh", ("920", "600"))):  # this message's later calls
        done = _gpu_script(name, *args, root=tmp_path, path=path, repo=repo)
        assert done.returncode == 0 and done.stdout.startswith("skip"), (name, done.stdout, done.stderr)
    assert not (tmp_path / "state" / "setup.pid").exists()
    again = _gpu_script("begin.sh", "900", root=tmp_path, path=path, repo=repo)
    assert "study: rag-h100-study-1 at finalists 18 booted" in again.stdout, again.stdout + again.stderr


def test_the_engine_caches_go_back_in_parts_after_a_boot_and_unpack_on_the_next_block(tmp_path: Path) -> None:
    """caches.sh: a poll packs the compile caches once a trial warmed up, without the files written
    in the last minute (a compile may be writing them); the next block's begin.sh unpacks them."""
    device = tmp_path / "device"
    cache = device / "state" / "cache"
    (cache / "vllm" / "torch_compile_cache").mkdir(parents=True)
    old = cache / "vllm" / "torch_compile_cache" / "model.so"
    old.write_bytes(os.urandom(20 << 20))  # incompressible: two parts of at most 15 MiB
    os.utime(old, (old.stat().st_atime - 600, old.stat().st_mtime - 600))
    (cache / "being-written.so").write_bytes(b"torn")
    (device / "study").mkdir(parents=True)
    log = device / "study" / "search.log"
    log.write_text("trial   0 boot    vllm engine defaults\n")
    before = _gpu_script("caches.sh", "pack", "rag-h100-study-1", root=device)
    assert before.returncode == 0 and before.stdout == "", before.stdout + before.stderr
    assert not (device / "out").exists(), "no pack before a boot has ended"
    log.write_text(log.read_text() + "trial   0 warmup  2 requests, boot 202 s\n")
    ninja = tmp_path / "ninja"  # a JIT build under way: FlashInfer's go through ninja
    shutil.copy("/bin/sleep", ninja)
    compiling = subprocess.Popen([str(ninja), "60"])
    try:
        waited = _gpu_script("caches.sh", "pack", "rag-h100-study-1", root=device)
    finally:
        compiling.kill()
        compiling.wait()
    assert waited.returncode == 0 and "a compiler runs" in waited.stdout, waited.stdout + waited.stderr
    assert not list((device / "out").glob("engine-cache-*")), "nothing packed while a compiler runs"
    packed = _gpu_script("caches.sh", "pack", "rag-h100-study-1", root=device)
    assert packed.returncode == 0 and "in 2 parts" in packed.stdout, packed.stdout + packed.stderr
    parts = sorted((device / "out").glob("engine-cache-rag-h100-study-1.tar.gz.*"))
    assert [p.name[-1] for p in parts] == ["0", "1"] and all(p.stat().st_size <= 15 << 20 for p in parts)
    carried = tmp_path / "engine-cache-rag-h100-study-1.tar.gz"
    carried.write_bytes(b"".join(p.read_bytes() for p in parts))
    same = _gpu_script("caches.sh", "pack", "rag-h100-study-1", root=device)  # the next poll, nothing new
    assert "as the last pack had them" in same.stdout and not list((device / "out").glob("engine-cache-*"))
    grown = cache / "triton" / "kernel.cubin"  # another engine's boot compiled more
    grown.parent.mkdir()
    grown.write_bytes(b"cubin")
    os.utime(grown, (grown.stat().st_atime - 600, grown.stat().st_mtime - 600))
    again = _gpu_script("caches.sh", "pack", "rag-h100-study-1", root=device)
    assert "in 2 parts" in again.stdout, again.stdout + again.stderr
    fresh = tmp_path / "fresh"
    unpacked = _gpu_script("caches.sh", "unpack", str(carried), root=fresh)
    assert unpacked.returncode == 0 and "1 files unpacked" in unpacked.stdout, unpacked.stdout + unpacked.stderr
    again = fresh / "state" / "cache" / "vllm" / "torch_compile_cache" / "model.so"
    assert again.read_bytes() == old.read_bytes()
    assert not (fresh / "state" / "cache" / "being-written.so").exists()
    missing = _gpu_script("caches.sh", "unpack", str(tmp_path / "none.tar.gz"), root=fresh)
    assert missing.returncode == 0 and "none carried" in missing.stdout
    torn = tmp_path / "torn.tar.gz"
    torn.write_bytes(parts[0].read_bytes()[:1000])
    broken = _gpu_script("caches.sh", "unpack", str(torn), root=tmp_path / "other")
    assert broken.returncode == 0 and "did not unpack" in broken.stdout, broken.stdout


def test_every_engine_cache_folder_lies_under_the_folder_a_block_carries(tmp_path: Path) -> None:
    """export_caches (common.sh), as study.sh and capacity_check.sh call it: each folder an engine
    writes compiled kernels to lies under $CACHE, which caches.sh packs. SGLang's JIT kernels do not
    follow XDG_CACHE_HOME: without their own variables the H100 study's block 15 carried nothing of
    SGLang's, and its first SGLang boot waited with the GPU idle, most likely building them again
    (reports/gpu-h100/study-1/block15/NOTES.md, "Boots")."""
    script = f'. "{GPU_SCRIPTS / "common.sh"}" && export_caches && echo "$CACHE" && env'
    done = subprocess.run(["bash", "-c", script], env={**os.environ, "GPU_ROOT": str(tmp_path)},
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    cache, *lines = done.stdout.splitlines()
    assert cache == str(tmp_path / "state" / "cache") and Path(cache).is_dir()
    folders = dict(line.split("=", 1) for line in lines if "=" in line)
    named = (
        "XDG_CACHE_HOME",
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "TVM_FFI_CACHE_DIR",
        "SGLANG_CACHE_DIR",
        "SGLANG_JIT_CACHE_DIR",
    )
    for name in named:
        assert Path(folders[name]).is_relative_to(cache), f"{name}={folders.get(name)} is not under {cache}"
    for script_name in ("study.sh", "capacity_check.sh"):
        assert "export_caches" in (GPU_SCRIPTS / script_name).read_text(), f"{script_name} sets its caches itself"


def test_after_a_block_the_study_file_the_caches_and_the_reset_counts_come_in(tmp_path: Path) -> None:
    """after_block.sh, on the files a block's last poll brought back (as the device tool leaves them,
    read-only): the study file and search.log into the study's folder, the caches' parts joined into
    .gpubundle/, vLLM's prefix-cache resets counted per log, and `tuner trials` of the file."""
    came = tmp_path / "device" / "26"
    came.mkdir(parents=True)
    (came / "rag-h100-study-1.db").write_bytes(H100_STUDY.read_bytes())
    (came / "search.log").write_text("trial   0 warmup  2 requests, boot 202 s\n")
    log = tmp_path / "run" / "studies" / "logs" / "rag-h100-study-1" / "trial-0000-vllm-repeat2.log"
    log.parent.mkdir(parents=True)
    log.write_text("INFO Successfully reset prefix cache\n" * 7 + "WARNING Failed to reset prefix cache\n")
    with tarfile.open(came / "logs.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "run", arcname="run")
    cache = tmp_path / "cache"
    (cache / "vllm").mkdir(parents=True)
    (cache / "vllm" / "kernel.so").write_bytes(os.urandom(1 << 20))
    whole = io.BytesIO()
    with tarfile.open(fileobj=whole, mode="w:gz") as tar:
        tar.add(cache / "vllm", arcname="./vllm")
    blob = whole.getvalue()
    for i, part in enumerate((blob[: len(blob) // 2], blob[len(blob) // 2 :])):
        (came / f"engine-cache-rag-h100-study-1.tar.gz.{i}").write_bytes(part)
    for f in came.iterdir():
        f.chmod(0o444)
    repo = tmp_path / "repo"
    env = {**os.environ, "REPO": str(repo), "TUNER": str(ROOT / ".venv" / "bin" / "tuner")}
    done = subprocess.run(["bash", str(GPU_SCRIPTS / "after_block.sh"), str(came), "rag-h100-study-1", "14"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    kept = repo / "reports" / "gpu-h100" / "study-1"
    assert (kept / "rag-h100-study-1.db").read_bytes() == H100_STUDY.read_bytes()
    assert os.access(kept / "rag-h100-study-1.db", os.W_OK), "the copy is the repository's to commit"
    assert (kept / "block14" / "search.log").read_text().startswith("trial   0 warmup")
    assert (repo / ".gpubundle" / "engine-cache-rag-h100-study-1.tar.gz").read_bytes() == blob
    assert "trial-0000-vllm-repeat2.log: prefix-cache resets 7 done, 1 refused" in done.stdout
    assert "so far 6.65, 6.34, 6.98: 6.66 [5.91, 7.83] (3 runs, 1 withdrawn)" in done.stdout, "tuner trials of the file"
    half = tmp_path / "half"  # a poll whose second part did not come back
    half.mkdir()
    (half / "engine-cache-rag-h100-study-1.tar.gz.0").write_bytes(blob[: len(blob) // 2])
    for caches, said in (
        (tmp_path / "none", f"none in {tmp_path / 'none'} (the kept ones, if any, stay); folders with parts: {came}"),
        (half, "do not make a whole archive"),
    ):
        again = subprocess.run(["bash", str(GPU_SCRIPTS / "after_block.sh"), str(came), "rag-h100-study-1", "14",
                                str(caches)], env=env, capture_output=True, text=True, timeout=120,
                               check=False)  # fmt: skip
        assert again.returncode == 0 and said in again.stdout, again.stdout + again.stderr
    kept_pack = repo / ".gpubundle" / "engine-cache-rag-h100-study-1.tar.gz"
    assert kept_pack.read_bytes() == blob, "a torn pack replaces nothing: the whole one kept before stays"
    assert [p.name for p in kept_pack.parent.iterdir()] == [kept_pack.name]
    wrong = subprocess.run(["bash", str(GPU_SCRIPTS / "after_block.sh"), str(came), "rag-a100", "14"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert wrong.returncode == 2 and "neither card" in wrong.stderr
