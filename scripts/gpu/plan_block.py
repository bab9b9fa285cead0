"""The numbers of a block's messages (reports/gpu-h200/study-1/RUNBOOK.md), from the device budget left
before the block and the seconds a start holds (the last start that came: the RUNBOOK's "The probe is
call 1" and the blocks' notes hold what starts held):

    python3 scripts/gpu/plan_block.py BUDGET_LEFT_S START_HELD_S [--last]

It prints `T` (no trial starts after it), `W` (each poll's wait) and every call of the block's two
messages in order. The first message is begin.sh alone: it is the probe. Session 37 probed, gave the
machine back, and the block's first call got none, so the calls behind it, each refused at a cost,
left too little of the lease for a trial (reports/gpu-h200/study-1/RUNBOOK.md, "Leases that ran nothing");
a lone call that gets no machine costs only its own start. When it comes back with one, the rest goes
at once as one message, led by begin.sh again, which does nothing on the machine still held and
starts the block on a fresh one where that went back while the message was written (a start, as the
probe's give_back cost every time).
`--last` is for the session's last device time, which is lost when the session ends: it plans one
trial down to a lower floor, a trial that may be cut by the lease's end (the RUNBOOK's "Below the
floor, at a session's end").
Call 1 carries both stages' archives (``archive.sh stages``): the card it gets picks its study and
that study's stage on the device (pick_stage.sh). Until session 47 the plan wrote one stage
(`--finalists`) before the card was known, and a machine whose study was at the other stage ran nothing.
Written by hand, these came out wrong once: block 5 of the H100 study took `T` from the RUNBOOK's
worked example, not from its own budget, and gave back 601 s where a third trial could have run
(reports/gpu-h100/study-1/block5/NOTES.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import carry_check  # the sibling script: where the engine caches a block carries are kept

# What a block's calls and trials hold, as the blocks' notes measured them (each block's "Device time"
# table, the latest: reports/gpu-h100/study-1/block5/NOTES.md; a trial's boot and search: the Trials
# tables of reports/gpu-h100.md), rounded up so that the polls and finish.sh end inside the budget.
PIECES = 22  # the bundle's pieces, one call each (.gpubundle/pieces)
PIECE_CALL_S = 7  # one piece's call: about 3 s in block 15, 6.5 s in block 16 (the H100 study's NOTES)
CALL1_AND_FINISH_S = 60  # call 1 and finish.sh together
MESSAGE_GAP_S = 30  # held and idle while the next message is written: at most the machine's idle release
GAPS = 1  # begin.sh's message, then the rest
POLLS = 6
POLL_MARGIN_S = 12  # per poll: its own start and the copy it brings back (up to W + 11 s in the H100 study's block 16)
POLL_TIMEOUT_EXTRA_S = 100  # a poll's limit over its wait: block_poll.sh prints and copies after waiting
TRIAL_S = 600  # a cold trial from boot to score: one started at T ends by the last poll
ONE_TRIAL_S = 850  # start, setup and one cold trial (the RUNBOOK's "When failures have eaten the budget")
# --last: start, setup and a trial as short as a pruned one, with the calls (the H100 study's block 7)
LAST_TRIAL_S = 700


@dataclass(frozen=True)
class Plan:
    budget_s: int  # B: the budget left less the block's start
    trial_deadline_s: int  # T
    poll_wait_s: int  # W

    @property
    def poll_timeout_s(self) -> int:
        return self.poll_wait_s + POLL_TIMEOUT_EXTRA_S


def plan(budget_left_s: int, start_held_s: int, floor_s: int = ONE_TRIAL_S) -> Plan | None:
    """The block's `T` and `W`, or None where the budget is under `floor_s` (which holds a start)."""
    if budget_left_s < floor_s:  # the floor holds a start already: not taken off twice
        return None
    b = budget_left_s - start_held_s
    return Plan(b, b - TRIAL_S, poll_wait_s(b))


def poll_wait_s(left_s: int) -> int:
    """Each poll's wait `W` where ``left_s`` is the budget once the block's machine has started: the
    polls, the pieces and finish.sh end inside it."""
    return (left_s - (PIECES + 1) * PIECE_CALL_S - CALL1_AND_FINISH_S - GAPS * MESSAGE_GAP_S) // POLLS - POLL_MARGIN_S


def waits_after_call1(p: Plan, rows: int = 10, step_s: int = 30) -> list[tuple[int, int]]:
    """(budget left, `W`) for starts longer than the plan took: message 2 is written after call 1's
    reply shows the budget its start left, so its polls take the first row at or below that figure.
    The H100 study's block 14 planned a shorter start than it got, and finish.sh was left no time
    (reports/gpu-h100/study-1/block14/NOTES.md, "Device time")."""
    return [(p.budget_s - i * step_s, poll_wait_s(p.budget_s - i * step_s)) for i in range(1, rows + 1)]


def cache_packs(bundle: Path = carry_check.BUNDLE, room: int | None = None) -> tuple[list[str], list[str]]:
    """The engine compile caches kept from the studies' last blocks (``carry_check.cache_packs``), as
    paths call 1 carries, newest first while they fit in ``room`` bytes (beside the tree and the
    stages' archives; no limit where None), and those left out. Call 1 does not know its card yet, so
    it carries both studies' packs where they fit."""
    carried: list[str] = []
    left: list[str] = []
    for f in sorted(carry_check.cache_packs(bundle), key=lambda f: -f.stat().st_mtime):
        fits = room is None or f.stat().st_size <= room
        (carried if fits else left).append(f".gpubundle/{f.name}")
        if fits and room is not None:
            room -= f.stat().st_size
    return carried, left


def call1_room() -> int:
    """The bytes call 1 may carry beyond the slim tree and the stages' archives."""
    archives = carry_check.stage_archive_bytes()
    return carry_check.CALL_LIMIT_BYTES - carry_check.MARGIN_BYTES - carry_check.tree_bytes() - archives


def messages(p: Plan, caches: tuple[str, ...] = ()) -> list[list[str]]:
    """The block's two messages, each a list of calls in order; begin.sh carries both stages'
    archives and ``caches`` (``cache_packs``), picks its card's study and stage, and unpacks that
    study's caches."""
    carry = " ".join(["carry", *carry_check.stage_archives(), *caches])
    begin = f"run, timeout 120, {carry}: bash scripts/gpu/begin.sh {p.trial_deadline_s}"
    pieces = [f"run, timeout 120, carry .gpubundle/pieces/p.{i:02d}: bash scripts/gpu/recv.sh | head -1"
              for i in range(PIECES)]  # fmt: skip
    polls = []
    for i in range(POLLS):
        deadline = p.trial_deadline_s if i < POLLS - 1 else 0  # the last poll restarts nothing
        polls.append(f"run, timeout {p.poll_timeout_s}: bash scripts/gpu/block_poll.sh {deadline} {p.poll_wait_s}")
    return [[begin], [begin, *pieces, *polls, "run, timeout 120: bash scripts/gpu/finish.sh", "give_back"]]


def main(argv: list[str]) -> int:
    last = "--last" in argv
    argv = [a for a in argv if a != "--last"]
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        print("usage: plan_block.py BUDGET_LEFT_S START_HELD_S [--last]", file=sys.stderr)
        return 2
    budget_left_s, held_s = map(int, argv)
    floor_s = LAST_TRIAL_S if last else ONE_TRIAL_S
    p = plan(budget_left_s, held_s, floor_s)
    if p is None:
        print(f"no block: {budget_left_s} s is under the {floor_s} s that a start, setup and one trial need")
        return 1
    print(f"B {p.budget_s} s: T {p.trial_deadline_s}, W {p.poll_wait_s} (poll timeout {p.poll_timeout_s})")
    if budget_left_s < ONE_TRIAL_S:
        print(f"--last: under {ONE_TRIAL_S} s, the one trial may be cut (finish.sh fails it, the next block queues "
              "it again)")  # fmt: skip
    missing = [a for a in carry_check.stage_archives() if not (carry_check.REPO / a).is_file()]
    if missing:  # the plan's numbers stand; its call 1 would begin nothing on the device
        print(f"stages: {', '.join(missing)} not built: run scripts/gpu/archive.sh stages before call 1")
    heads = ("alone; no machine: no block, plan again later", "at once when it came back with a machine")
    n = 0
    carried, left = cache_packs(room=call1_room())
    caches = tuple(carried)
    kept = f"engine caches carried: {', '.join(caches)}"
    print(kept if caches else "engine caches: none kept; the engines compile afresh")
    if left:
        print(f"engine caches left out (call 1 would not fit them): {', '.join(left)}")
    for head, calls in zip(heads, messages(p, caches), strict=True):
        print(f"message ({head}):")
        for call in calls:
            n += 1
            print(f"{n:2d}. {call}")
    rows = ", ".join(f"{left} W {wait}" for left, wait in waits_after_call1(p))
    print(f"polls' W where call 1 left less than {p.budget_s} s (its start took longer; the first row at or below "
          f"its budget_left_s, poll timeout W + {POLL_TIMEOUT_EXTRA_S}): {rows}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
