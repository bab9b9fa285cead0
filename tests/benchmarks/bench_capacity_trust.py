"""Capacity you can trust, on the vLLM CPU build: the same config searched again and again, before and after.

Run: ``.venv/bin/python -m tests.benchmarks bench_capacity_trust [--repeats 5] [--boots 5] [--before REV]``
(about an hour on 2 cores with the defaults). Writes its section of ``reports/capacity.md`` and
``reports/capacity.json``. Not part of the default test run; it boots vLLM.

The engine defaults are served as a trial serves them (``bench_capacity.Setup``: the default space,
the generated models, the CPU build's KV budget). Each search is ``tuner drive --url URL --workload
rag --capacity --tiers-for cpu --tier interactive --json``, run as a user runs it, by two codes side by
side: *after*, this checkout, and *before*, a ``git worktree`` of ``--before`` (default 191f2db, the
commit before distinct requests and decided steps), run with the same interpreter. They alternate,
the one that goes first swapping from one search to the next, so drift on the machine falls on both.

1. One boot: ``--repeats`` searches by each code on the same server.
2. Fresh boots: ``--boots`` boots, each searched once by each code.
3. The engine's own client: ``tuner verify`` (where this checkout has it) at the capacity the last
   *after* search of part 1 claimed, and at 1.2x it, on that same server.

For each code and part: the capacities' median, minimum, maximum and spread (max / min - 1), and the
median search time. The goal (issue 24) is two searches on one boot within one resolution step
(10 %) of each other, and the engine's client at the claimed capacity no more than 5 points below the
target and below it at 1.2x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.benchmarks import _report
from tests.benchmarks._report import ROOT, table
from tests.benchmarks.bench_capacity import Setup
from tests.benchmarks.stamp import stamp

NAME = "capacity_trust"
MD_PATH, JSON_PATH = ROOT / "reports" / "capacity.md", ROOT / "reports" / "capacity.json"
DRIVE = ["drive", "--workload", "rag", "--capacity", "--tiers-for", "cpu", "--tier", "interactive", "--json"]
SEARCH_TIMEOUT_S = 1800


def before_tree(rev: str) -> Path:
    """A worktree of ``rev`` beside the checkout (made once), whose ``tuner`` package is the old code."""
    where = Path("/tmp") / f"tuner-before-{rev}"
    if not (where / "tuner").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True)
    return where


def drive(code: Path, url: str, model_dir: str) -> dict[str, Any]:
    """One capacity search by the tuner at ``code`` (its package first on the path), as its JSON report."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tuner", *DRIVE, "--url", url, "--model", model_dir],
        cwd=code, env=env, capture_output=True, text=True, timeout=SEARCH_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"tuner drive at {code} exited {done.returncode}: {done.stderr[-1500:]}")
    found = json.loads(done.stdout)["capacity"]["tiers"]["interactive"]
    return {
        "capacity_req_s": found["capacity_req_s"],
        "bracket_req_s": found.get("bracket_req_s"),
        "attainment_interval": found.get("attainment_interval"),
        "steps": len(found["steps"]),
        "requests": sum(int(s["n_requests"]) for s in found["steps"]),
        "wall_s": round(time.monotonic() - started, 1),
        "stop": found["stop_reason"],
    }


def verify(url: str, model_dir: str, rate: float) -> dict[str, Any] | None:
    """``tuner verify`` at ``rate`` (1x and 1.2x), or None where this checkout has no such command."""
    args = [sys.executable, "-m", "tuner", "verify", "--url", url, "--workload", "rag", "--model", model_dir,
            "--rate", f"{rate:.6g}", "--tier", "interactive", "--tiers-for", "cpu", "--json"]  # fmt: skip
    if subprocess.run([*args[:4], "--help"], capture_output=True).returncode != 0:
        return None
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=SEARCH_TIMEOUT_S)
    if done.returncode not in (0, 1):  # 1: it ran, and the goal was missed (the JSON says where)
        return {"error": done.stderr[-1500:]}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def verify_only(rev: str) -> dict[str, Any]:
    """``--only-verify``: one boot, one *after* search, ``tuner verify`` at its claim on the same server;
    the earlier searches of the section are kept as they were."""
    setup = Setup()
    with setup.serve({}, "verify") as server:
        server.wait_ready(600)
        searched = drive(ROOT, server.base_url, setup.model.path)
        claimed = searched["capacity_req_s"]
        verified = verify(server.base_url, setup.model.path, claimed) if claimed else None
    old = json.loads(JSON_PATH.read_text()).get(NAME, {}) if JSON_PATH.exists() else {}
    return {**old, "before_rev": old.get("before_rev", rev), "verify": verified, "verify_search": searched}


# what a --before revision measured differently, for the report's text
BEFORE_SAYS = {
    "191f2db": "steps cycle a pool and pass on the point estimate; its `rag` preset is not GuideLLM's RAG shape",
    "7c6bc66": "the H200's capacity check 6: an undecided step is a fail, the saturation cut on each half",
}


def both(codes: dict[str, Path], url: str, model_dir: str, first: int) -> dict[str, dict[str, Any]]:
    order = list(codes) if first % 2 == 0 else list(reversed(codes))
    return {name: drive(codes[name], url, model_dir) for name in order}


def run(repeats: int, boots: int, rev: str) -> dict[str, Any]:
    setup = Setup()
    codes = {"before": before_tree(rev), "after": ROOT}
    model_dir = setup.model.path
    one_boot: list[dict[str, dict[str, Any]]] = []
    with setup.serve({}, "one-boot") as server:
        server.wait_ready(600)
        for i in range(repeats):
            one_boot.append(both(codes, server.base_url, model_dir, i))
            setup.progress.line(f"one boot, search {i + 1}: " + _said(one_boot[-1]))
        claimed = one_boot[-1]["after"]["capacity_req_s"] if one_boot else 0.0
        verified = verify(server.base_url, model_dir, claimed) if claimed else None
    fresh: list[dict[str, dict[str, Any]]] = []
    for i in range(boots):
        with setup.serve({}, f"boot-{i + 1}") as server:
            server.wait_ready(600)
            fresh.append(both(codes, server.base_url, model_dir, i))
        setup.progress.line(f"fresh boot {i + 1}: " + _said(fresh[-1]))
    return {"before_rev": rev, "one_boot": one_boot, "fresh_boots": fresh, "verify": verified,
            "plan": {"target": setup.plan.target, "resolution": setup.plan.resolution}}  # fmt: skip


def _said(pair: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{n} {r['capacity_req_s']:.3g} req/s in {r['wall_s']:.0f} s" for n, r in pair.items())


def summary(runs: list[dict[str, dict[str, Any]]], code: str) -> list[Any]:
    values = [r[code]["capacity_req_s"] for r in runs]
    walls = [r[code]["wall_s"] for r in runs]
    if not values:
        return [code, 0, "-", "-", "-", "-", "-"]
    low, high = min(values), max(values)
    spread = f"{high / low - 1:.0%}" if low > 0 else "-"
    return [code, len(values), f"{statistics.median(values):.3g}", f"{low:.3g}", f"{high:.3g}", spread,
            f"{statistics.median(walls):.0f}"]  # fmt: skip


def _verify_text(data: dict[str, Any]) -> str:
    found = data.get("verify")
    if found is None:
        return "This checkout has no `tuner verify`: not measured."
    if "error" in found:
        return "`tuner verify` failed: " + str(found["error"]).strip().splitlines()[-1][:300]
    searched = data.get("verify_search")
    said = "On the one-boot server, at the last *after* search's claim: "
    if searched and data.get("verify_stamp"):
        earlier = [r["after"]["capacity_req_s"] for r in data.get("one_boot", [])]
        versus = (f" ({searched['capacity_req_s'] / statistics.median(earlier):.2f} times the one-boot *after* "
                  "searches' median above)" if earlier else "")  # fmt: skip
        said = (f"On its own boot (stamped {data['verify_stamp']['commit']}): one *after* search claimed "
                f"{searched['capacity_req_s']:.3g} req/s{versus}, then `tuner verify` ran vLLM's own client on "
                "that server. ")  # fmt: skip
    rows = []
    for run in found["runs"]:
        for tier, v in run["tiers"].items():
            rows.append([f"{run['share']:g}x", f"{run['rate_req_s']:.3g}", tier, f"{v['attainment']:.3f}",
                         f"{v.get('attainment_low', float('nan')):.3f}-{v.get('attainment_high', float('nan')):.3f}",
                         f"{v['n_counted']} / {v['n_requests']}", v.get("decision", "-"),
                         "met" if run["goal_met"][tier] else "**not met**", _queue(run)])  # fmt: skip
    head = ["share", "req/s", "tier", "attainment", "interval", "counted / sent", "decision", "goal",
            "server's waiting queue"]  # fmt: skip
    return said + "Goal: at 1x at most 5 points under the target, at 1.2x under it.\n\n" + table(head, rows)


def _queue(run: dict[str, Any]) -> str:
    """The server's waiting queue over the client's run, as `tuner verify` judged it."""
    waiting = run.get("queue_waiting") or []
    if run.get("queue_growing") is None:
        return "not sampled"
    return f"{'growing' if run['queue_growing'] else 'not growing'} ({min(waiting):g}-{max(waiting):g})"


def render(data: dict[str, Any]) -> str:
    head = ["code", "searches", "median req/s", "min", "max", "spread (max/min - 1)", "median search s"]
    lines = [
        "## Capacity you can trust: the same config searched again, before and after",
        "",
        "Regenerate: `python -m tests.benchmarks bench_capacity_trust`. The vLLM defaults on the CPU build, "
        "interactive tier, each search a `tuner drive --capacity` run as a user runs it; *before* is "
        f"`{data['before_rev']}` ({BEFORE_SAYS.get(data['before_rev'], 'see CHANGELOG.md')}), *after* this "
        "commit. The codes alternate. Each code drives its own `rag` preset at the served context: where "
        "the two presets differ, the capacities' levels do not compare across the codes; their spreads do.",
        "",
        "### One boot",
        "",
        table(head, [summary(data["one_boot"], c) for c in ("before", "after")]),
        "",
        "### Fresh boots",
        "",
        table(head, [summary(data["fresh_boots"], c) for c in ("before", "after")]),
        "",
        "### The engine's own client at the claimed capacity",
        "",
        _verify_text(data),
        "",
        f"Goal: two searches on one boot within one resolution step ({data['plan']['resolution']:.0%}) of each "
        "other; the engine's client no more than 5 points below the target at the claimed capacity, and below "
        "it at 1.2x. Each search's figures are in `reports/capacity.json` under `capacity_trust`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--boots", type=int, default=5)
    parser.add_argument("--before", default="191f2db")
    parser.add_argument("--only-verify", action="store_true", help="redo the engine client's part alone")
    args = parser.parse_args()
    run_stamp = stamp()
    if args.only_verify:
        data = verify_only(args.before)
        data["verify_stamp"] = run_stamp
        data.setdefault("stamp", run_stamp)
    else:
        data = {**run(args.repeats, args.boots, args.before), "stamp": run_stamp}
    _report.write_section(NAME, render(data), data, md_path=MD_PATH, json_path=JSON_PATH)
    print(render(data))


if __name__ == "__main__":
    main()
