"""A block's messages as scripts/gpu/plan_block.py writes them: begin.sh alone (the probe), then the
rest led by begin.sh again; the polls and finish.sh inside the budget, and no trial started that the
lease cannot finish."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import GPU_SCRIPTS, load_gpu_script

SCRIPT = GPU_SCRIPTS / "plan_block.py"


@pytest.mark.parametrize(("budget", "held"), [(1800, 0), (1770, 29), (1409, 30), (1064, 90), (900, 40)])
def test_the_polls_end_inside_the_budget_and_the_last_trial_by_the_last_poll(budget: int, held: int) -> None:
    pb = load_gpu_script("plan_block")
    p = pb.plan(budget, held)
    assert p is not None and p.budget_s == budget - held
    spent = (
        pb.CALL1_AND_FINISH_S + (pb.PIECES + 1) * pb.PIECE_CALL_S + pb.GAPS * pb.MESSAGE_GAP_S
        + pb.POLLS * (p.poll_wait_s + pb.POLL_MARGIN_S)
    )  # fmt: skip
    assert p.budget_s - pb.POLLS <= spent <= p.budget_s, "the polls use the lease to its end, and no further"
    assert p.trial_deadline_s + pb.TRIAL_S <= p.budget_s, "a trial started at T ends as the last poll does"
    assert p.trial_deadline_s == p.budget_s - pb.TRIAL_S, "and T is no earlier than that: an earlier T leaves budget"


def test_a_longer_start_than_planned_gets_shorter_polls_that_still_leave_finish_sh_its_time() -> None:
    """Block 14 of the H100 study planned a 30 s start; it took 89 s, and finish.sh got 1 s. Message 2
    is written after call 1's reply, so its polls take the W of the budget that reply shows."""
    pb = load_gpu_script("plan_block")
    p = pb.plan(1709, 30)
    rows = pb.waits_after_call1(p)
    assert [left for left, _ in rows] == sorted((left for left, _ in rows), reverse=True) and rows[0][0] < p.budget_s
    for left, wait in rows:
        calls = (pb.PIECES + 1) * pb.PIECE_CALL_S + pb.GAPS * pb.MESSAGE_GAP_S
        after_call1 = calls + pb.POLLS * (wait + pb.POLL_MARGIN_S)
        assert left - after_call1 >= pb.CALL1_AND_FINISH_S, "finish.sh has its time after the last poll"
    # block 14 as it ran: call 1 left 1620 s, the polls held W + 7 to W + 12 s each, call 2 came 17 s later
    wait = next(w for left, w in rows if left <= 1620)
    assert 1620 - 17 - pb.PIECES * 3 - pb.POLLS * (wait + 8) >= pb.CALL1_AND_FINISH_S
    # block 16 as it ran on W 218, read off the row the older figures gave: call 1 left 1527 s, call 2
    # came 19 s later, the 22 pieces held 142 s, each poll W + 8 to W + 11 s, and finish.sh got 3 s
    wait = next(w for left, w in pb.waits_after_call1(pb.plan(1618, 30)) if left <= 1527)
    assert 1527 - 19 - 142 - pb.POLLS * (wait + 11) >= pb.CALL1_AND_FINISH_S
    printed = subprocess.run([sys.executable, str(SCRIPT), "1709", "30"], capture_output=True, text=True, check=True)
    last = printed.stdout.splitlines()[-1]
    assert last.startswith("polls' W where call 1 left less than 1679 s") and f"{rows[0][0]} W {rows[0][1]}" in last


def test_the_messages_are_the_runbooks_calls_in_order() -> None:
    pb = load_gpu_script("plan_block")
    p = pb.plan(1770, 29)
    first, second = pb.messages(p)
    begin = f"bash scripts/gpu/begin.sh {p.trial_deadline_s}"
    assert len(first) == 1 and first[0].endswith(begin), "begin.sh alone probes"
    for stage in ("sampling", "finalists"):  # both: the card it gets picks one (pick_stage.sh)
        assert f".gpubundle/stage-{stage}.tar.gz .gpubundle/stage-{stage}.commit" in first[0]
    assert second[0] == first[0], "the rest starts the block again where the first machine went back"
    pieces, third = second[1 : 1 + pb.PIECES], second[1 + pb.PIECES :]
    assert [re.search(r"p\.(\d\d)", c).group(1) for c in pieces] == [f"{i:02d}" for i in range(pb.PIECES)]  # type: ignore[union-attr]
    polls = third[: pb.POLLS]
    deadlines = [int(c.split()[-2]) for c in polls]
    assert deadlines == [p.trial_deadline_s] * (pb.POLLS - 1) + [0], "the last poll restarts nothing"
    assert all(c.split()[-1] == str(p.poll_wait_s) and f"timeout {p.poll_timeout_s}:" in c for c in polls)
    assert third[pb.POLLS :] == ["run, timeout 120: bash scripts/gpu/finish.sh", "give_back"]


def test_a_budget_that_holds_no_trial_plans_no_block() -> None:
    pb = load_gpu_script("plan_block")
    assert pb.plan(pb.ONE_TRIAL_S - 1, 30) is None
    edge = pb.plan(pb.ONE_TRIAL_S, 30)  # the start is in ONE_TRIAL_S, not taken off it again
    assert edge is not None and edge.poll_wait_s > 0 and edge.trial_deadline_s > 0
    done = subprocess.run([sys.executable, str(SCRIPT), "601", "0"], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout.startswith("no block:") and len(done.stdout.splitlines()) == 1
    printed = subprocess.run([sys.executable, str(SCRIPT), "1770", "29"], capture_output=True, text=True, check=True)
    lines = printed.stdout.splitlines()
    p = pb.plan(1770, 29)
    assert lines[0] == f"B 1741 s: T {p.trial_deadline_s}, W {p.poll_wait_s} (poll timeout {p.poll_timeout_s})"
    kept = tuple(pb.cache_packs(room=pb.call1_room())[0])  # this checkout's .gpubundle: none, or the last blocks'
    calls = [c for m in pb.messages(p, kept) for c in m]
    assert [line.split(". ", 1)[1] for line in lines if re.match(r"^ ?\d+\. ", line)] == calls
    assert any(line.startswith("engine caches") for line in lines)
    assert [line for line in lines if line.startswith("message")][0].startswith("message (alone")
    bad = subprocess.run([sys.executable, str(SCRIPT), "many"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_last_device_time_plans_one_trial_below_the_floor_and_says_it_may_be_cut() -> None:
    pb = load_gpu_script("plan_block")
    assert pb.plan(pb.LAST_TRIAL_S - 1, 30, pb.LAST_TRIAL_S) is None
    p = pb.plan(779, 30, pb.LAST_TRIAL_S)  # the H100 study's block 7
    assert p is not None and (p.trial_deadline_s, p.poll_wait_s) == (149, 71)  # its polls held 93 s: W 88 then
    run = [sys.executable, str(SCRIPT), "779", "30"]
    refused = subprocess.run(run, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and refused.stdout.startswith("no block:")
    printed = subprocess.run([*run, "--last"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert printed[0] == "B 749 s: T 149, W 71 (poll timeout 171)" and "may be cut" in printed[1]
    above = subprocess.run([*run[:2], "900", "30", "--last"], capture_output=True, text=True, check=True)
    assert "may be cut" not in above.stdout, "above the floor --last plans a block like any other"


def test_no_call_names_a_stage_the_device_picks_it() -> None:
    """Until session 47 a finalists block's begin.sh carried its stage (FINALISTS=1 ...) and one tag's
    archive, chosen before the card was known; the card now picks (pick_stage.sh)."""
    pb = load_gpu_script("plan_block")
    p = pb.plan(1770, 29)
    assert not any("FINALISTS" in call or "tuner-head" in call for m in pb.messages(p) for call in m)
    printed = subprocess.run([sys.executable, str(SCRIPT), "1770", "29", "--finalists"], capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert printed.returncode == 2 and "usage" in printed.stderr


def test_both_begin_calls_carry_the_engine_caches_kept(tmp_path: Path) -> None:
    pb = load_gpu_script("plan_block")
    assert pb.cache_packs(tmp_path) == ([], [])
    (tmp_path / "engine-cache-rag-h100-study-1.tar.gz").write_bytes(b"x")
    (tmp_path / "stage-finalists.tar.gz").write_bytes(b"x")
    carried, left = pb.cache_packs(tmp_path)
    kept = tuple(carried)
    assert kept == (".gpubundle/engine-cache-rag-h100-study-1.tar.gz",) and left == []
    p = pb.plan(1770, 29)
    first, second = pb.messages(p, caches=kept)
    assert first[0] == second[0] and f"stage-finalists.commit {kept[0]}: " in first[0]
    assert all(kept[0] not in call for call in second[1:]), "only begin.sh carries them"


def test_call_1_carries_the_newest_caches_that_fit_and_names_the_rest(tmp_path: Path) -> None:
    """Call 1 does not know its card, so it carries both studies' packs, but only as many as fit
    beside the tree and the archives; the newest first (the study that ran last)."""
    pb = load_gpu_script("plan_block")
    older, newer = tmp_path / "engine-cache-rag-h200-study-1.tar.gz", tmp_path / "engine-cache-rag-h100-study-1.tar.gz"
    older.write_bytes(b"x" * 300)
    newer.write_bytes(b"x" * 200)
    os.utime(older, (1, 1))
    assert pb.cache_packs(tmp_path, room=400) == ([f".gpubundle/{newer.name}"], [f".gpubundle/{older.name}"])
    assert pb.cache_packs(tmp_path, room=500) == ([f".gpubundle/{newer.name}", f".gpubundle/{older.name}"], [])
    assert pb.call1_room() < load_gpu_script("carry_check").CALL_LIMIT_BYTES
