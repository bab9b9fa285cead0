"""Render what the fault suite and the fuzz properties recorded into ``reports/reliability.md`` and
``reports/reliability.json``. Run after the tests:

    scripts/test.sh tests/faults tests/unit/cli/test_fuzz_inputs.py tests/unit/cli/test_safety.py
    .venv/bin/python -m tests.faults.report

Nothing is written by hand: every row is one test's own record (``tests.faults.outcomes``), written
whether its test passed, failed or was skipped, with that outcome and what it observed up to there.
A failed or skipped row says so in its row and in the counts; a fault whose test did not run (or
stopped in a fixture before the test began) has no record and is listed as missing, in its place in
the table and after it. Only the newest run's records are read (the run whose last record is newest;
``--run ID`` picks another): a record from an earlier run never fills a gap in this one. The header
carries that run's stamp.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tests.benchmarks.stamp import stamp_line
from tests.faults.outcomes import NO_NEXT_RUN, NOT_OBSERVED, RESULTS, ROOT

OUT = ROOT / "reports"
# Every row the suite records when every test ran (the two real-engine ones included), in the order a
# reader meets the faults: the engine's, the machine's, the storage's, the user's.
EXPECTED_FAULTS = ("never_ready", "exit_boot", "http_500", "stream_cut", "bad_sse", "slow", "stall", "die_mid",
                   "metrics_bad", "metrics_missing", "SIGKILL-engine-mid-workload", "port-taken-once",
                   "port-taken-twice", "disk-full-for-log", "storage-outage-short", "storage-outage-long",
                   "SIGINT-during-boot", "SIGTERM-during-boot", "SIGINT-during-workload", "SIGTERM-during-workload",
                   "SIGKILL-tuner", "SIGKILL-tuner-real-engine", "SIGINT-during-export", "SIGTERM-during-export",
                   "SIGINT-while-writing-moving", "SIGINT-while-writing-staging",
                   "secrets-in-environment")  # fmt: skip
EXPECTED_FUZZ = ("cli-values", "search-space-yaml", "slo-strings", "trace-files")
RECORDS = ("fault-*.json", "fuzz-*.json", "finding-*.json")


def newest_run() -> Path | None:
    """The run folder whose last record is the newest (None: no run recorded anything)."""
    folders = [d for d in RESULTS.iterdir() if d.is_dir()] if RESULTS.is_dir() else []
    runs = {d: [p.stat().st_mtime for g in RECORDS for p in d.glob(g)] for d in folders}
    recorded = {d: max(times) for d, times in runs.items() if times}
    return max(recorded, key=lambda d: recorded[d]) if recorded else None


def load(run: Path) -> dict[str, Any]:
    """The records of one run, and what that run should have recorded but did not."""

    def read(pattern: str) -> list[dict[str, Any]]:
        records = [json.loads(p.read_text()) for p in sorted(run.glob(pattern))]
        return [r for r in records if r.get("run_id", run.name) == run.name]

    faults = sorted((_as_observed(r) for r in read("fault-*.json")), key=_place)
    fuzz, findings = read("fuzz-*.json"), read("finding-*.json")
    times = sorted(r["recorded_at"] for r in (*faults, *fuzz, *findings) if "recorded_at" in r)
    stamp_file = run / "run.json"
    missing = [f for f in EXPECTED_FAULTS if f not in {r["fault"] for r in faults}]
    return {
        "run_id": run.name,
        "stamp": json.loads(stamp_file.read_text()) if stamp_file.exists() else {"run_id": run.name},
        "recorded": {"first": times[0], "last": times[-1]} if times else None,
        "missing_faults": missing,
        "missing_fuzz": [p for p in EXPECTED_FUZZ if p not in {r["prop"] for r in fuzz}],
        "faults": faults,
        "fuzz": fuzz,
        "open_findings": findings,
        "totals": {**_fault_totals(faults, missing), **_fuzz_totals(fuzz)},
    }


def _as_observed(row: dict[str, Any]) -> dict[str, Any]:
    """A record in today's shape. Records of runs before outcomes were kept were written only once
    their test passed, with what the tuner did as one sentence: they read as passed, and as said."""
    row = {"outcome": "passed", **row}
    if isinstance(row.get("tuner_did"), str):
        row["tuner_did"] = [row["tuner_did"]]
    return row


def outcome_kind(row: dict[str, Any]) -> str:
    """``passed``, ``failed``, ``skipped``, or the outcome itself when it is none of these."""
    return str(row["outcome"]).split(":", 1)[0]


def _fault_totals(faults: list[dict[str, Any]], missing: list[str]) -> dict[str, int]:
    kinds = [outcome_kind(f) for f in faults]
    resumable = [f["resumed"] for f in faults if f["resumed"] != NO_NEXT_RUN]

    def observed(key: str) -> list[int]:
        return [f[key] for f in faults if f[key] is not None]

    return {
        "expected": len(EXPECTED_FAULTS),
        "faults": len(faults),
        "passed": kinds.count("passed"),
        "failed": kinds.count("failed"),
        "skipped": kinds.count("skipped"),
        "missing": len(missing),
        "processes_left": sum(observed("processes_left")),
        "processes_left_not_observed": len(faults) - len(observed("processes_left")),
        "trials_lost": sum(observed("trials_lost")),
        "trials_lost_not_observed": len(faults) - len(observed("trials_lost")),
        "resumed": sum(r is True for r in resumable),
        "resume_observed": sum(isinstance(r, bool) for r in resumable),
        "resume_not_observed": sum(r is None for r in resumable),
    }


def _fuzz_totals(fuzz: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "fuzzed_inputs": sum(f["tried"] for f in fuzz),
        "fuzzed_worked": sum(f["worked"] for f in fuzz),
        "fuzzed_exit2_one_line": sum(f["exit2_one_line"] for f in fuzz),
        "fuzzed_other": sum(len(f["other"]) for f in fuzz),
    }


def _place(row: dict[str, Any]) -> tuple[int, str]:
    name = row["fault"]
    return (EXPECTED_FAULTS.index(name) if name in EXPECTED_FAULTS else len(EXPECTED_FAULTS)), name


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _outcome_cell(outcome: str) -> str:
    """Passed plainly; anything else in bold, so a failed or skipped fault stands out in the table."""
    kind, _, why = outcome.partition(": ")
    return "passed" if outcome == "passed" else f"**{kind.upper()}**" + (f": {why}" if why else "")


def _observed(value: object) -> str:
    if value is None:
        return NOT_OBSERVED
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return str(value)


def _fault_row(f: dict[str, Any]) -> str:
    did = "; ".join(f["tuner_did"]) or NOT_OBSERVED
    cells = [f["fault"], _outcome_cell(f["outcome"]), f["engine"], f["injected"], did, f["recorded"],
             _observed(f["processes_left"]), _observed(f["trials_lost"]), _observed(f["resumed"])]  # fmt: skip
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _missing_row(fault: str) -> str:
    return f"| {_cell(fault)} | **MISSING**: no record in this run |" + " |" * 7


def _fault_summary(t: dict[str, int]) -> list[str]:
    not_passed = t["failed"] + t["skipped"] + t["missing"]
    head = f"**{t['expected']} faults expected, {t['passed']} passed**" + (
        f": {t['failed']} failed, {t['skipped']} skipped, {t['missing']} missing (not recorded)." if not_passed else "."
    )
    unseen = [f"{n} {what}" for n, what in ((t["processes_left_not_observed"], "processes left"),
              (t["trials_lost_not_observed"], "trials lost"), (t["resume_not_observed"], "resumed")) if n]  # fmt: skip
    return [
        head,
        "",
        f"In the {t['faults']} recorded: processes left {t['processes_left']}, trials lost {t['trials_lost']}, "
        f"study resumed after {t['resumed']} of the {t['resume_observed']} where it was observed (the faults "
        f"with a next run)" + (f"; not observed (the test ended first): {', '.join(unseen)}." if unseen else "."),
    ]


def render(data: dict[str, Any]) -> str:
    t = data["totals"]
    recorded = data["recorded"]
    when = f", records made {recorded['first']} to {recorded['last']}" if recorded else ""
    lines = [
        "# Reliability: faults injected, bad input fuzzed",
        "",
        f"_{stamp_line(data['stamp'])}._",
        "",
        f"Generated by `python -m tests.faults.report` from the records of one test run only (`{data['run_id']}`"
        f"{when}); every row is one test's own record of what it observed, written whether the test passed, "
        "failed or was skipped.",
        "",
        *_fault_summary(t),
        "",
        "| fault | outcome | engine | injected | what the tuner did (observed) | recorded class | processes left "
        "| trials lost | resumed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = {f["fault"]: _fault_row(f) for f in data["faults"]}
    order = [*EXPECTED_FAULTS, *(f["fault"] for f in data["faults"] if f["fault"] not in EXPECTED_FAULTS)]
    lines += [rows[name] if name in rows else _missing_row(name) for name in order]
    not_passed = [f for f in data["faults"] if f["outcome"] != "passed"]
    if not_passed:
        lines += ["", "**Not passed in this run**: " + "; ".join(f"`{f['fault']}` {f['outcome']}" for f in not_passed)
                  + "."]  # fmt: skip
    if data["missing_faults"]:
        lines += ["", f"**Missing from this run**: {len(data['missing_faults'])} of the {len(EXPECTED_FAULTS)} "
                  "fault rows were not recorded (their tests did not run in it, those marked `engine` need the "
                  "real vLLM CPU build, or stopped in a fixture before the test began): "
                  + ", ".join(f"`{f}`" for f in data["missing_faults"]) + "."]  # fmt: skip
    lines += [
        "",
        "## Fuzzed inputs",
        "",
        f"**{t['fuzzed_inputs']} inputs** through the real CLI: {t['fuzzed_worked']} worked, "
        f"{t['fuzzed_exit2_one_line']} gave exit 2 with exactly one line on stderr, {t['fuzzed_other']} other. "
        + _fuzz_verdict(data["fuzz"]),
        "",
        "| property | outcome | inputs | worked (exit 0) | exit 2, one line | other |",
        "|---|---|---|---|---|---|",
    ]
    for f in data["fuzz"]:
        outcome = f.get("outcome", "passed")  # older records were written only when the property passed
        shown = outcome if outcome == "passed" else f"**{_cell(outcome)}**"
        lines.append(f"| {f['prop']} | {shown} | {f['tried']} | {f['worked']} | {f['exit2_one_line']} "
                     f"| {'; '.join(_cell(o) for o in f['other']) or 0} |")  # fmt: skip
    if data["missing_fuzz"]:
        lines += ["", "**Missing from this run**: " + ", ".join(f"`{p}`" for p in data["missing_fuzz"]) + "."]
    if data["open_findings"]:
        lines += ["", "## Open findings", "",
                  "Bugs the suite revealed in modules it does not own, each pinned by a strict `xfail` test "
                  "(the fuzz properties keep clear of these inputs until they are fixed):", ""]  # fmt: skip
        lines += [f"- **{f['finding']}** ({f['where']}): {f['fix']}" for f in data["open_findings"]]
    return "\n".join(lines) + "\n"


def _fuzz_verdict(fuzz: list[dict[str, Any]]) -> str:
    """What the properties' own checks concluded, from their outcomes: each passed property held every
    input to a clean ending (no traceback, study file, engine or hang), and a failed one did not."""
    failed = [f["prop"] for f in fuzz if f.get("outcome", "passed") != "passed"]
    if failed:
        return f"**{len(failed)} of {len(fuzz)} properties failed**: " + ", ".join(f"`{p}`" for p in failed) + "."
    return (
        f"All {len(fuzz)} properties passed: no input gave a traceback, a study file, an engine or a hang "
        '(each property\'s own checks; an "other" ending is one the property allows, listed in its row).'
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.report", description="Render the newest test run's reliability records."
    )
    parser.add_argument("--run", help=f"render this run (a folder under {RESULTS}) instead of the newest")
    args = parser.parse_args()
    run = RESULTS / args.run if args.run else newest_run()
    if run is None or not run.is_dir():
        sys.exit(f"no test run recorded under {RESULTS}{f' as {args.run}' if args.run else ''}: run the tests first")
    data = load(run)
    if not data["faults"] and not data["fuzz"]:
        sys.exit(f"run {run.name} recorded no fault and no fuzz property: run the tests first")
    (OUT / "reliability.json").write_text(json.dumps(data, indent=2) + "\n")
    (OUT / "reliability.md").write_text(render(data))
    t = data["totals"]
    print(
        f"{OUT / 'reliability.md'}: {t['passed']} of {t['expected']} faults passed, {t['failed']} failed, "
        f"{t['skipped']} skipped, {t['missing']} missing; {t['fuzzed_inputs']} fuzzed inputs"
    )


if __name__ == "__main__":
    main()
