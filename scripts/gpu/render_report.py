"""Render the trials of the H200 study as a Markdown table, from its SQLite file alone (sqlite3 and
json: no Optuna needed), into reports/gpu-h200.md between the markers
``<!-- trials:begin -->`` and ``<!-- trials:end -->``, so the report follows the study as it grows.

    python scripts/gpu/render_report.py [reports/gpu-h200/rag-h200.db] [reports/gpu-h200.md]
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- trials:begin -->", "<!-- trials:end -->"
GIB = 2**30


def load(db: Path, study: str = "rag-h200") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (study_id,) = con.execute("select study_id from studies where study_name = ?", (study,)).fetchone()
        attrs = {k: json.loads(v) for k, v in con.execute(
            "select key, value_json from study_user_attributes where study_id = ?", (study_id,))}  # fmt: skip
        trials: dict[int, dict[str, Any]] = {}
        for tid, number, state, start, end in con.execute(
            "select trial_id, number, state, datetime_start, datetime_complete from trials where study_id = ?"
            " order by number",
            (study_id,),
        ):
            trials[tid] = {"number": number, "state": state, "start": start, "end": end, "attrs": {}, "params": {}}
        for tid, key, value in con.execute("select trial_id, key, value_json from trial_user_attributes"):
            if tid in trials:
                trials[tid]["attrs"][key] = json.loads(value)
        for tid, name, value, dist in con.execute(
            "select trial_id, param_name, param_value, distribution_json from trial_params"
        ):
            if tid in trials:
                d = json.loads(dist)
                choices = d.get("attributes", {}).get("choices")
                trials[tid]["params"][name] = choices[int(value)] if choices is not None else value
    finally:
        con.close()
    return attrs, list(trials.values())


def _f(value: Any, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def describe(t: dict[str, Any]) -> str:
    a = t["attrs"]
    if a.get("config_kind") == "engine_default":
        return "engine defaults"
    c = a.get("config") or {k.split(".", 1)[1]: v for k, v in t["params"].items() if "." in k}
    parts = [f"chunk {c['chunk_size']}" if "chunk_size" in c else None,
             f"mem {c['memory_fraction']:g}" if "memory_fraction" in c else None]  # fmt: skip
    k = c.get("num_speculative_tokens", 0)
    parts.append(f"spec {c.get('draft_model')} K={k}" if k else "no spec")
    return ", ".join(p for p in parts if p)


def row(t: dict[str, Any]) -> str:
    a = t["attrs"]
    m, s = a.get("metrics") or {}, a.get("server") or {}
    engine = a.get("engine") or t["params"].get("engine", "?")
    failure = a.get("failure") or ("–" if t["state"] == "COMPLETE" else t["state"].lower())
    served = a.get("failure") is None and bool(m)
    rate, length = s.get("spec_acceptance_rate"), s.get("spec_mean_accept_len")
    spec = "–" if rate is None else f"{rate:.2f} / {length:.2f}"
    good = f"{m['goodput_req_s']:.1f} ({100 * m['good_fraction']:.0f} %)" if served and "goodput_req_s" in m else "–"
    cells = [
        str(t["number"]), engine, describe(t), failure, _f(a.get("boot_s")),
        _f(m.get("ttft_p50_ms")) if served else "–", _f(m.get("ttft_p95_ms")) if served else "–",
        _f(m.get("tpot_p95_ms"), "{:.1f}") if served else "–",
        _f(m.get("output_throughput_tok_s")) if served else "–", good, spec,
        _f(a.get("peak_memory_bytes", 0) / GIB, "{:.1f}"),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def table(attrs: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in (attrs.get("slo") or {}).items())
    head = (
        "| # | engine | config | failure | boot s | TTFT p50 ms | TTFT p95 ms | TPOT p95 ms | output tok/s "
        f"| goodput req/s (good) at {slo} | spec acceptance rate / mean length | peak GPU GiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head, *(row(t) for t in trials)]
    served = [t for t in trials if t["attrs"].get("failure") is None and t["attrs"].get("metrics")]
    if served:
        best = max(served, key=lambda t: t["attrs"]["metrics"].get("goodput_req_s", 0.0))
        lines.append("")
        lines.append(
            f"{len(trials)} trials, {len(served)} served, "
            f"{sum(1 for t in trials if t['attrs'].get('failure'))} failed. Highest goodput in one run: "
            f"trial {best['number']} ({best['attrs']['engine']}, {describe(best)}), "
            f"{best['attrs']['metrics']['goodput_req_s']:.1f} req/s."
        )
        goodput = lambda t: t["attrs"]["metrics"]["goodput_req_s"]  # noqa: E731
        for engine in sorted({t["attrs"].get("engine") for t in served}):
            mine = [t for t in served if t["attrs"].get("engine") == engine]
            d = next((t for t in mine if t["attrs"].get("config_kind") == "engine_default"), None)
            tuned = [t for t in mine if t["attrs"].get("config_kind") != "engine_default"]
            if d is None or not tuned:
                continue
            b = max(tuned, key=goodput)
            lines.append(
                f"{engine}: best sampled trial {b['number']} ({describe(b)}) {goodput(b):.1f} req/s against its "
                f"defaults (trial {d['number']}) {goodput(d):.1f} req/s: {goodput(b) / goodput(d):.2f}x, "
                f"one run each (no repeats, no verdict)."
            )
    return "\n".join(lines)


def main(db: Path, report: Path) -> None:
    attrs, trials = load(db)
    rendered = table(attrs, trials)
    text = report.read_text() if report.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{report}: no {BEGIN} ... {END} markers")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    report.write_text(f"{before}{BEGIN}\n{rendered}\n{END}{after}")
    print(rendered)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]) if args else ROOT / "reports" / "gpu-h200" / "rag-h200.db",
        Path(args[1]) if len(args) > 1 else ROOT / "reports" / "gpu-h200.md",
    )
