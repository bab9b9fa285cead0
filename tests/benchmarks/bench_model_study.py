"""The performance model on a GPU study's own trials: leave one trial out, as the study's next boots see it.

Run: ``.venv/bin/python -m tests.benchmarks.bench_model_study [--card h200|h100]`` (boots nothing;
minutes on 2 cores; ``--render`` rewrites the section from its stored rows). Not part of the default
test run. Study 1 of that card (``CARDS``; the default the H200's,
``reports/gpu-h200/study-1/rag-h200-study-1.db``), or ``--storage URL --study NAME``.
Writes the card's section of ``reports/search.md`` and ``reports/search_model.json``:
``model-study`` for the H200, ``model-study-h100`` for the H100.

For each served trial, the model is fitted on every other served trial of the study (as ``tuner plan
--study`` fits it, ``tuner.search.model.ranking``) and predicts that trial's capacity under each scored
tier; the truth is the capacity the trial's own search claimed, with its bracket. What the other trials
never measured (an engine never booted, a draft never run on that engine) gives a range instead of
one value, and a prediction the model cannot make at all (no trial of that engine) says so. Reported
per trial: the point prediction and its range against the claim and its bracket, and the seconds the
fit and prediction took here; then how many point predictions came within 20 % of the claim, and how
many claims lie inside the predicted range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import optuna

from tests.benchmarks import _report
from tuner.engines import ADAPTERS
from tuner.search.model.history import served_of
from tuner.search.model.parallel import default_workers
from tuner.search.model.predict import EngineModel
from tuner.search.model.ranking import device_of_study, plan_of_study, shapes_of
from tuner.search.model.simulate import TARGET_FEATURES
from tuner.study.attrs import trial_attrs

# card -> (its study 1, the study file, the report section)
CARDS = {
    card: (f"rag-{card}-study-1", f"sqlite:///{_report.REPORTS / f'gpu-{card}' / 'study-1' / f'rag-{card}-study-1.db'}",
           "model-study" if card == "h200" else f"model-study-{card}")
    for card in ("h200", "h100")
}  # fmt: skip
STUDY, STORAGE, _ = CARDS["h200"]
WITHIN = 0.20  # the goal, as bench_model judges the CPU table
MD_PATH = _report.REPORTS / "search.md"
JSON_PATH = _report.REPORTS / "search_model.json"


def label(engine: str, params: dict[str, Any]) -> str:
    """A trial's config in a few words: its engine and the parameters it sets (a K-by-batch-size
    schedule as its bands, ``K by running requests 1-4: 4, 5-16: 2, 17-4096: 0``)."""
    if not params:
        return f"{engine} defaults"
    said = [f"{k}={v}" for k, v in params.items() if k != "spec_schedule"]
    if params.get("spec_schedule"):
        bands = ", ".join(f"{first}-{last}: {k}" for first, last, k in params["spec_schedule"])
        said.append(f"K by running requests {bands}")
    return f"{engine} " + ", ".join(said)


def leave_one_out(study: optuna.Study) -> dict[str, Any]:
    plan = plan_of_study(study)
    if plan is None:
        raise SystemExit(f"study {study.study_name!r} is not a capacity study: it stores no capacity plan")
    device = device_of_study(study)
    adapters = {name: cls() for name, cls in ADAPTERS.items()}
    # the trials the model learns from (``served_trials``: complete and pruned), each held out in turn
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    served = {t.number: s for t in trials if (s := served_of(t, {})) is not None}
    # the model on every trial: how well its costs explain the token times, and what it says of the
    # trials it was fitted on (a bound on what leaving one out can give)
    everything = list(served.values())
    workers = default_workers()  # each fit's simulations over this machine's cores: the same fit, sooner
    full = EngineModel.fit(everything, adapters, device, plan, shapes_of(everything), workers=workers)
    fits = {engine: f.as_dict() for engine, f in full.fits.items()}
    rows: list[dict[str, Any]] = []
    for number, held in served.items():
        others = [s for n, s in served.items() if n != number]
        began = time.monotonic()
        model = EngineModel.fit(others, adapters, device, plan, shapes_of(others), workers=workers)
        said = model.predict(held.engine, held.params, held.kv_tokens)
        seconds = time.monotonic() - began
        tiers = (trial_attrs(study.trials[number]).get("capacity") or {}).get("tiers") or {}
        row: dict[str, Any] = {"trial": number, "config": label(held.engine, dict(held.params)),
                               "basis": next(iter(said.values())).basis, "seconds": round(seconds, 1)}  # fmt: skip
        inside = full.predict(held.engine, held.params, held.kv_tokens)
        for tier in plan.scored:
            p, claim = said[tier], tiers.get(tier) or {}
            row[tier] = {"predicted": p.capacity_req_s, "range": [p.low_req_s, p.high_req_s],
                         "measured": claim.get("capacity_req_s"), "bracket": claim.get("bracket_req_s"),
                         "in_sample": inside[tier].capacity_req_s}  # fmt: skip
        rows.append(row)
        print(f"trial {number}: " + ", ".join(f"{t} {_fig(row[t]['predicted'])} vs {_fig(row[t]['measured'])}"
                                              for t in plan.scored), flush=True)  # fmt: skip
    return {"study": study.study_name, "device": device.name, "tiers": list(plan.scored), "rows": rows,
            "summary": summaries(rows, plan.scored), "fits": fits}  # fmt: skip


def summaries(rows: list[dict[str, Any]], tiers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each tier's ``summarize`` of the rows: at the run, and again where ``--render`` rewrites it."""
    return {tier: summarize([r[tier] for r in rows]) for tier in tiers}


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """How the point predictions and ranges of one tier met the claims."""
    pairs = [(c["predicted"], c["measured"]) for c in cells if c["predicted"] is not None and c["measured"]]
    errors = [p / m - 1 for p, m in pairs]
    ranged = [c for c in cells if c["range"][0] is not None and c["measured"]]
    return {
        "trials": len(cells), "predicted": len(pairs),
        # a pruned tier claims 0 (only its bracket): nothing to hold a prediction against
        "unclaimed": sum(1 for c in cells if not c["measured"]),
        "unpredicted": sum(1 for c in cells if c["predicted"] is None),
        "within": sum(1 for e in errors if abs(e) <= WITHIN),
        "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
        "ranged": len(ranged),
        "in_range": sum(1 for c in ranged if c["range"][0] * (1 - 1e-9) <= c["measured"] <= c["range"][1] * (1 + 1e-9)),
    }  # fmt: skip


def _fig(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _range(cell: dict[str, Any]) -> str:
    low, high = cell["range"]
    if low is None:
        return "-"
    return _fig(low) if abs(high - low) <= 1e-9 * max(high, 1.0) else f"{_fig(low)}–{_fig(high)}"


def _error(cell: dict[str, Any]) -> str:
    if cell["predicted"] is None or not cell["measured"]:
        return "-"
    return f"{cell['predicted'] / cell['measured'] - 1:+.0%}"


def render(data: dict[str, Any], card: str) -> str:
    tiers = data["tiers"]
    per_tier = ("predicted", "range", "claimed [bracket)", "error", "in-sample")
    header = ["trial", "config", *(f"{t} {h}" for t in tiers for h in per_tier), "basis", "fit and predict (s)"]
    body = []
    for r in data["rows"]:
        cells: list[Any] = [r["trial"], f"`{r['config']}`"]
        for t in tiers:
            c = r[t]
            bracket = c["bracket"] or [None, None]
            claimed = f"{_fig(c['measured'])} [{_fig(bracket[0])}, {_fig(bracket[1])})"
            cells += [_fig(c["predicted"]), _range(c), claimed, _error(c), _fig(c["in_sample"])]
        body.append([*cells, r["basis"], r["seconds"]])
    lines = [
        f"## The performance model on the {card.upper()} study (`tests/benchmarks/bench_model_study.py`)", "",
        f"Study `{data['study']}` on {data['device']}, leave one trial out: the model is fitted on every other "
        "served trial of the study and predicts the held-out trial's capacity (req/s) before, as it were, it "
        "boots; the truth is the capacity that trial's own search claimed. A range is what the other trials "
        "left unmeasured (a draft or an engine they never ran); one value means every fact was measured. "
        "The in-sample column is the model fitted on every trial, the held-out one included.", "",
        _report.table(header, body), "",
    ]  # fmt: skip
    for t in tiers:
        s = data["summary"][t]
        mae = "-" if s["median_abs_error"] is None else f"{s['median_abs_error']:.0%}"
        lines.append(
            f"- {t}: {s['within']} of {s['predicted']} point predictions within {WITHIN:.0%} of the claim "
            f"(median absolute error {mae}); {s['in_range']} of {s['ranged']} claims inside the predicted range; "
            f"{s['unclaimed']} of {s['trials']} trials claimed nothing to hold a prediction against (pruned); "
            f"{s['unpredicted']} of {s['trials']} the model could not predict at all."
        )  # fmt: skip
    for engine, f in data["fits"].items():
        lines.append(
            f"- The fit on every trial, {engine}: relative RMS error of the token times {f['residual']:.0%} over "
            f"{f['requests']} requests of {f['steps']} steps, after {f['rounds']} fixed-point rounds. "
            f"Costs (s; attention per million token pairs): "
            + ", ".join(f"{k} {f['target'][k]:.3g}" for k in TARGET_FEATURES if k in f["target"])
            + f"; per request {f['overhead_s']:.3g}."
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--card", choices=sorted(CARDS), default="h200")
    parser.add_argument("--storage", help="the study file (default: the card's)")
    parser.add_argument("--study", help="the study's name (default: the card's)")
    parser.add_argument("--render", action="store_true", help="rewrite the section from the stored rows (no fit)")
    args = parser.parse_args()
    study_name, storage, section = CARDS[args.card]
    if args.render:  # the same run, its summary recomputed from its rows: the stamp stays the run's
        data = json.loads(JSON_PATH.read_text())[section]
        data["summary"] = summaries(data["rows"], data["tiers"])
        _report.write_section(section, render(data, args.card), data, MD_PATH, JSON_PATH)
        return
    started = _report.stamp()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name=args.study or study_name, storage=args.storage or storage)
    data = {"stamp": started, **leave_one_out(study)}
    text = render(data, args.card)
    _report.write_section(section, text, data, MD_PATH, JSON_PATH)
    print(text)


if __name__ == "__main__":
    main()
