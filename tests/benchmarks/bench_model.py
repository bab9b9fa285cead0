"""The performance model (``--sampler model``) against the capacity table: how well it predicts, how fast it finds.

Run: ``.venv/bin/python -m tests.benchmarks.bench_model [--seeds 20] [--grid heavy]`` (boots nothing;
about half an hour on 2 cores). Not part of the default test run. Writes the model's sections of
``reports/search.md`` (``bench_search`` keeps them when it rewrites the rest) and
``reports/search_model.json``: ``model`` for the first capacity table, ``model-heavy`` for the second
(``_table.CAPACITY_GRIDS``).

* Prediction: leave one config out. For each served config of the table, the model is fitted on every
  other served config's recorded steps and predicts this one's capacity under each tier; the truth is
  the config's own ladder (``bench_search.capacity_truth``). Reported: the share of configs predicted
  within 20 % (the issue's goal: 80 %), the median error, and the rank correlation (Spearman).
* Search: studies replayed against the table as ``bench_search`` replays them (the tuner's own
  objective, memory screen, capacity search and pruning), with ``--sampler model`` among TPE, random
  and grid, the engine default left in and left out: trials and boots until the best feasible
  capacity is within 10 % of the grid's best.

The first table was served before the model existed, by the rag preset of its commit; its rows keep
each request's tokens but not its prompt, so the prompts' block structure comes from
``capacity_grid_prefixes.json`` (``tests/benchmarks/capacity_grid_prefixes.py`` rebuilt it from that
commit's own code, checked against the table's workload digest). Each step sent the workload from its
first request on, so a row's position in its step names its request. The heavy table's rows name
their requests, and its workload is today's rag preset: it is rebuilt here (checked against the
table's digest) and grown as its steps grew it, as a study's own sampler reads its prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from tests.benchmarks import _report, _table, bench_search, model_diagnosis
from tests.benchmarks.stamp import stamp_line
from tuner.engines.base import Device
from tuner.engines.prometheus import parse_prometheus
from tuner.engines.speculation import proposer_of
from tuner.engines.vllm import VllmAdapter
from tuner.measure.rate_steps import CapacityPlan, Measured
from tuner.search.memory import parse_facts
from tuner.search.model.history import Served
from tuner.search.model.predict import EngineModel
from tuner.search.model.requests import Shape, StudyRequests
from tuner.search.model.sampler import ModelContext, ModelSampler
from tuner.search.options import SearchOptions
from tuner.search.resolve import resolve_workload
from tuner.workloads.base import load_tokenizer

PREFIXES = _table.CAPACITY_TABLE.parent / "capacity_grid_prefixes.json"
WITHIN = 0.20  # the goal: predicted within 20 % of the measured ladder
GOAL_SHARE = 0.80
TIERS = ("interactive", "relaxed")
SEARCH_SAMPLERS = ("model", "tpe (tuner default)", "random", "grid")
# What a closed-loop drive scores (``tuner.search.pruning.running_values``: the objectives other than
# capacity), predicted on the latency table
DRIVE_METRICS = ("ttft_p95_ms", "output_throughput_tok_s", "goodput_req_s")
# --grid latency: the latency table (``_table.TABLE``), closed-loop drives; latency-ngram: the small table
# measured with the share of decode steps that proposed (``grid-cpu-ngram.yaml``)
LATENCY_TABLES = {"latency": _table.TABLE, "latency-ngram": _table.TABLE.with_name("grid_vllm_cpu_rag_ngram.json")}
MD_PATH = _report.REPORTS / "search.md"
JSON_PATH = _report.REPORTS / "search_model.json"


def with_ids(table: dict[str, Any], n_requests: int) -> dict[str, Any]:
    """The table with each row named by its request (its position in the step, the workload cycled)."""
    points = {}
    for k, p in table["points"].items():
        rungs = {}
        for r, m in p["rungs"].items():
            rows = sorted(m.rows, key=lambda row: float(row["sent_s"]))
            rungs[r] = replace(m, rows=[{**row, "request_id": str(i % n_requests)} for i, row in enumerate(rows)])
        points[k] = {**p, "rungs": rungs}
    return {**table, "points": points}


def light_requests() -> StudyRequests:
    """The first table's requests, rebuilt from the prefixes file: a fixed set, sent again in order."""
    requests = json.loads(PREFIXES.read_text())["requests"]
    shapes = [Shape(r["prompt_tokens"], r["max_tokens"], tuple(r["blocks"])) for r in requests]
    return StudyRequests(shapes, {str(i): tuple(r["blocks"]) for i, r in enumerate(requests)})


def preset_requests(table: dict[str, Any]) -> StudyRequests:
    """A table's workload as ``tuner search`` builds it today for the sampler (``context_of``),
    checked against the digest the table recorded; it grows as a prediction needs."""
    model = _table.models(table)
    name = table["workload"]["name"]
    workload = resolve_workload(SearchOptions(workload=name, objective="capacity"), model)
    if workload.digest() != table["workload"]["digest"]:
        raise SystemExit(f"bench_model: the {name} preset is not the one the table served (its digest differs)")
    return StudyRequests.of_workload(workload.requests, workload.grow, load_tokenizer(Path(model.path)))


def heavy_requests(table: dict[str, Any]) -> StudyRequests:
    """The heavy table's workload (``preset_requests``), grown to every request its steps sent."""
    requests = preset_requests(table)
    requests.cover(str(r["request_id"]) for p in table["points"].values() for m in p["rungs"].values() for r in m.rows)
    return requests


def device_of(table: dict[str, Any]) -> Device:
    d = table["device"]
    return Device(d["kind"], d["name"], d["memory_bytes"])


def served_of(table: dict[str, Any], blocks: Mapping[str, tuple[int, ...]]) -> dict[str, Served]:
    out = {}
    for k, p in table["points"].items():
        if p["failure"]:
            continue
        kv = parse_facts("\n".join(p["memory_lines"])).get("kv_tokens")
        steps = tuple(_blocked(m, blocks) for m in p["rungs"].values())
        out[k] = Served("vllm", p["params"], None if kv is None else int(kv), steps)
    return out


def _blocked(m: Measured, blocks: Mapping[str, tuple[int, ...]]) -> Measured:
    return replace(m, rows=[{**r, "blocks": blocks.get(str(r["request_id"]))} for r in m.rows])


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> np.ndarray:
        a = np.asarray(v, dtype=float)
        order = a.argsort()
        r = np.empty(len(a))
        r[order] = np.arange(len(a))
        for value in set(v):  # ties share their mean rank
            r[a == value] = r[a == value].mean()
        return r

    rx, ry = ranks(xs), ranks(ys)
    return float(np.corrcoef(rx, ry)[0, 1]) if len(xs) > 2 and rx.std() and ry.std() else math.nan


def in_bracket(predicted: float, bracket: tuple[float, float]) -> bool:
    """Whether ``predicted`` lies within ``WITHIN`` of what the ladder resolved: no lower than that
    share under its answer, no higher than that share over its lowest failing rung."""
    low, high = bracket
    return (1 - WITHIN) * low <= predicted <= (1 + WITHIN) * high


def leave_one_out(served: dict[str, Served], truth: dict[str, dict[str, float]], plan: CapacityPlan,
                  device: Device, requests: StudyRequests, brackets: dict[str, dict[str, tuple[float, float]]],
                  again: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:  # fmt: skip
    adapters = {"vllm": VllmAdapter()}
    began = time.time()
    # the table's truth is a ladder: a rung a look passed early stands, as it was not served whole
    full = EngineModel.fit(list(served.values()), adapters, device, plan, requests, hold=False)
    fit_s = time.time() - began
    rows: list[dict[str, Any]] = []
    for k, s in served.items():
        began = time.time()
        model = EngineModel.fit([o for kk, o in served.items() if kk != k], adapters, device, plan, requests, full.fits,
                                hold=False)  # fmt: skip
        predicted = model.predict("vllm", s.params, s.kv_tokens)
        rows.append({"config": k, "seconds": round(time.time() - began, 1),
                     **{f"{t}_predicted": predicted[t].capacity_req_s for t in TIERS},
                     **{f"{t}_measured": truth[k][t] for t in TIERS}})  # fmt: skip
        print(f"loo {k}: " + ", ".join(f"{t} {rows[-1][f'{t}_predicted']:.2f} vs {truth[k][t]:.2f}" for t in TIERS),
              flush=True)  # fmt: skip
    summary = {}
    for t in TIERS:
        pairs = [(float(r[f"{t}_predicted"] or 0.0), float(r[f"{t}_measured"])) for r in rows]
        errors = [p / m - 1 for p, m in pairs if m > 0]
        summary[t] = {
            "within": sum(1 for e in errors if abs(e) <= WITHIN), "configs": len(pairs),
            "within_bracket": sum(in_bracket(float(r[f"{t}_predicted"] or 0.0), brackets[r["config"]][t])
                                  for r in rows),
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else math.nan,
            "median_error": statistics.median(errors) if errors else math.nan,
            "spearman": spearman([p for p, _ in pairs], [m for _, m in pairs]),
        }  # fmt: skip
    return {"rows": rows, "summary": summary, "fit": full.fits["vllm"].as_dict(), "fit_s": round(fit_s, 1),
            "hit_rate": full.hit, "acceptance": full.acceptance.get("vllm", {}),
            "diagnosis": diagnose(served, truth, full, plan, device, rows, again or {})}  # fmt: skip


def diagnose(served: dict[str, Served], truth: dict[str, dict[str, float]], full: EngineModel, plan: CapacityPlan,
             device: Device, rows: list[dict[str, Any]],
             again: dict[str, dict[str, float]]) -> dict[str, Any]:  # fmt: skip
    """Each candidate cause of the model's error, measured (``model_diagnosis``), and the truth's noise
    floor: from configs identical in effect, and from configs the table served twice (``again``: each
    one's second ladder, on a fresh boot)."""
    truth = {**truth, **{f"{k} (served again)": v for k, v in again.items()}}
    pairs = model_diagnosis.equivalent_pairs(served) + [(k, f"{k} (served again)") for k in again]
    noise = {t: model_diagnosis.noise_floor(pairs, truth, t) for t in TIERS}
    return {
        "client_overhead_ms": model_diagnosis.client_overhead_ms(served),
        "ttft_bound_ms": plan.tiers["interactive"].get("ttft_p95_ms"),
        "arrival_gaps_s": model_diagnosis.arrival_gaps_s(served, plan.burstiness, plan.seed),
        "cache": model_diagnosis.cache_by_pool(served),
        "bias": model_diagnosis.latency_bias(served, full.fits["vllm"], full.acceptance.get("vllm", {}), device),
        "pairs": pairs, "noise": noise,
        # how many requests one rung's attainment rests on, at most
        "rung_sent": statistics.median(len(m.rows) for s in served.values() for m in s.steps),
        "in_band": {t: model_diagnosis.in_band(rows, t, noise[t]["sigma"]) for t in TIERS},
    }  # fmt: skip


def search(table: dict[str, Any], plan: CapacityPlan, seeds: int, requests: StudyRequests) -> dict[str, Any]:
    truth = bench_search.capacity_truth(table, plan)
    space = _table.capacity_space(table)
    models = _table.models(table)
    context = ModelContext(space, {"vllm": VllmAdapter()}, _table.grid_offers(space, models), models,
                           device_of(table), plan, requests)  # fmt: skip

    def bound(seed: int) -> optuna.samplers.BaseSampler:
        sampler = ModelSampler(seed)
        sampler.bind(context)
        return sampler

    bench_search.SAMPLERS["model"] = bound
    out: dict[str, Any] = {"truth": truth, "with_default": {}, "without_default": {}}
    for with_default, label in ((False, "without_default"), (True, "with_default")):
        for name in SEARCH_SAMPLERS:
            began = time.time()
            runs = [bench_search.run_capacity_once(name, seed, table, truth, plan, with_default=with_default)
                    for seed in range(seeds)]  # fmt: skip
            out[label][name] = bench_search.summarize_capacity(runs, truth["size"]) | {"runs": runs}
            done = out[label][name]
            print(f"search {label} {name}: median {done['median_trials']} trials, {done['median_boots']} boots "
                  f"({time.time() - began:.0f} s)", flush=True)  # fmt: skip
    return out


def _reused(data: dict[str, Any]) -> str:
    """Where the prediction comes from an earlier run than the search (``--search-only``), which one."""
    own = data["prediction"].get("stamp")
    if not own or own == data["stamp"]:
        return ""
    return f" The prediction below is from an earlier run: {stamp_line(own)}."


def _measured(data: dict[str, Any]) -> str:
    """When the table was served, from the run's record of it (``measured``)."""
    m = data["prediction"].get("measured")
    if not m:
        return "when it was served: not recorded"
    again = f"; {m['repeats']} configs served again" if m.get("repeats") else ""
    extended = f"; {m['extended']} ladders climbed on from a later boot" if m.get("extended") else ""
    return (f"served {m['first']} to {m['last']}, the run started on {m['commit']}, 1-minute load average "
            f"{m['load_low']:.1f}-{m['load_high']:.1f} before each boot{again}{extended}")  # fmt: skip


def _pct(value: float | None, sign: str = "+") -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:{sign}.0f} %"


def render(data: dict[str, Any]) -> str:
    loo, s = data["prediction"], data["search"]
    grid = data.get("grid", "light")
    table = _table.CAPACITY_GRIDS[grid][0].name
    on = "" if grid == "light" else f", the {grid} table"
    lines = [
        f"## The performance model: prediction (`tests/benchmarks/bench_model.py --grid {grid}`{on})", "",
        f"The table `tests/benchmarks/data/{table}` (`{data.get('table', 'grid-cpu-capacity.yaml')}`, "
        f"{_measured(data)}).{_reused(data)} Leave one config out over the capacity table's served configs: "
        "the model is fitted on every other config's recorded steps (the table's rungs) and predicts this "
        "one's capacity before it would boot; the truth is the config's own ladder. Goal: within 20 % for "
        "at least 80 % of the served configs.", "",
        _report.table(["tier", "within 20 %", "median error", "median abs error", "rank correlation (Spearman)",
                       "within 20 % of the ladder's bracket"],
                      [[t, f"{v['within']}/{v['configs']}", _pct(v["median_error"]), _pct(v["median_abs_error"], ""),
                        f"{v['spearman']:.2f}", f"{v['within_bracket']}/{v['configs']}"]
                       for t, v in loo["summary"].items()]), "",
        "The goal is judged on the first columns: the error against the ladder's answer, its highest "
        "passing rung. A ladder resolves more than that rung: the capacity lies between it and the lowest "
        "failing rung above it. The last column counts predictions within 20 % of that bracket: no more "
        "than 20 % under its answer and no more than 20 % over its lowest failing rung. It is shown beside "
        "the goal, and does not replace it.", "",
    ]  # fmt: skip
    noise, in_band = loo["diagnosis"]["noise"], loo["diagnosis"]["in_band"]
    for t, v in loo["summary"].items():
        met = "met" if v["within"] >= GOAL_SHARE * v["configs"] else "not met"
        n = noise[t]
        reach = " (under the goal: out of reach on this table)" if n["perfect_within"] < GOAL_SHARE else ""
        lines.append(
            f"- {t}: {v['within']} of {v['configs']} within 20 %: goal {met}. One measurement of this tier's "
            f"ladder carries a log noise of {n['sigma']:.2f} ({n['pairs']} pairs of ladders of one config or of "
            "configs identical in effect, below), so a predictor that knew each config's true capacity would be "
            f"within 20 % of the table for {100 * n['perfect_within']:.0f} % of configs{reach}; "
            f"a prediction honestly carries ±{100 * n['band']:.0f} % (90 %), and {in_band[t]} of {v['configs']} "
            "measurements lie inside that band."
        )  # fmt: skip
    lines += [
        "", "Per config (req/s, predicted / measured):", "",
        _report.table(["config", *[f"{t} predicted / measured" for t in TIERS]],
                      [[r["config"], *[f"{(r[f'{t}_predicted'] or 0):.2f} / {r[f'{t}_measured']:.2f}" for t in TIERS]]
                       for r in loo["rows"]]), "",
        _fit_line(loo, "steps'"), "",
    ]  # fmt: skip
    lines += _search_lines(s, on) if s else []
    lines += _wrong_lines(data, on)
    return "\n".join(lines) + "\n"


def _fit_line(run: dict[str, Any], of: str) -> str:
    """The fit on all served configs, as a run stored it (``fit``, ``fit_s``, ``hit_rate``, ``acceptance``)."""
    fit = run["fit"]
    return (
        "The fit on all served configs (seconds per unit; attention per million token pairs): "
        + ", ".join(f"{k} {v:.3g}" for k, v in fit["target"].items())
        + "; drafting " + "; ".join(f"{d}: " + ", ".join(f"{k} {v:.3g}" for k, v in c.items())
                                     for d, c in fit["drafts"].items())
        + f"; per request {fit['overhead_s']:.3g}; relative RMS error of the fitted token times "
        f"{100 * fit['residual']:.0f} % over {fit['requests']} requests of {fit['steps']} steps "
        f"({run['fit_s']:.0f} s). Prefix-cache hit rate (median of the {of} counters) {run['hit_rate']:.2f}; "
        "per-position acceptance " + ", ".join(f"{d} {a:.2f}" for d, a in run["acceptance"].items()) + "."
    )  # fmt: skip


def _search_lines(s: dict[str, Any], on: str) -> list[str]:
    header = ["sampler", "median trials", "quartiles", "median boots", "machine s (quartiles)", "proposing s",
              "reached", "failing booted", "screened", "pruned"]  # fmt: skip

    def rows(results: dict[str, Any]) -> list[list[Any]]:
        return [[bench_search.shown(name), f"{r['median_trials']:g}", f"{r['q1']:g}-{r['q3']:g}",
                 f"{r['median_boots']:g}",
                 f"{r['median_machine_s']:.0f} ({r['machine_q1']:.0f}-{r['machine_q3']:.0f})",
                 f"{r['median_proposing_s']:.1f}" if "median_proposing_s" in r else "-",
                 f"{r['reached']}/{r['seeds']}", f"{r['failing_booted']:g}", f"{r['screened']:g}", f"{r['pruned']:g}"]
                for name in SEARCH_SAMPLERS if (r := results.get(name))]  # fmt: skip  # the run's order, not the JSON's

    out, rnd = s["without_default"]["model"], s["without_default"]["random"]
    met = out["median_trials"] <= 3 and out["median_boots"] <= rnd["median_boots"] / 2
    truth = s["truth"]
    return [
        f"## The performance model: search{on}", "",
        f"Studies replayed against the capacity table as `bench_search` replays them, {out['seeds']} seeds each, "
        f"until the best feasible interactive capacity is within 10 % of the grid's best ({truth['best_capacity']:.3g} "
        "req/s by the ladders). Trials count everything recorded (screened included), boots the trials that "
        "started an engine. Machine s is the table's recorded boot and search time up to then; proposing s "
        "(median) is what the sampler's own calls took on the machine that ran this benchmark up to then, "
        "which a study spends beside it (\"-\": a run before it was counted). Goal, default left out: a median "
        "of at most 3 trials, and at most half of random search's boots.", "",
        "Default left out:", "", _report.table(header, rows(s["without_default"])), "",
        "Default left in (trial 0, as `tuner search` runs it):", "", _report.table(header, rows(s["with_default"])), "",
        f"- default left out: `--sampler model` needed a median {out['median_trials']:g} trials and "
        f"{out['median_boots']:g} boots, random search {rnd['median_trials']:g} and {rnd['median_boots']:g}: "
        f"goal {'met' if met else 'not met'}.", "",
    ]  # fmt: skip


def _wrong_lines(data: dict[str, Any], on: str) -> list[str]:
    rows, d = data["prediction"]["rows"], data["prediction"]["diagnosis"]
    worst = sorted(rows, key=lambda r: -abs(math.log(max(r["interactive_predicted"] or 1e-9, 1e-9)
                                                     / max(r["interactive_measured"], 1e-9))))[:3]  # fmt: skip
    cache, bias = d["cache"], d["bias"]
    median = data["prediction"]["summary"]["interactive"]["median_error"]
    way = "over" if median > 0 else "under"
    pairs = "; ".join(f"`{a}` against `{b}`" for a, b in d["pairs"])
    # a ladder that stops at the same rung under both tiers was ended by its queue, not a latency bound
    same = sum(1 for r in rows if r["interactive_measured"] == r["relaxed_measured"])
    return [
        f"## Where the model is wrong, and why{on}", "",
        f"The model's median interactive error is {_pct(median)} ({way}-prediction). Each candidate cause, "
        "measured from the table's recorded steps (`tests/benchmarks/model_diagnosis.py`); what earlier "
        "runs found and the fixes they led to are in CHANGELOG.md:", "",
        f"- Per-request overhead outside the engine (HTTP, tokenising): the client's mean TTFT exceeds the "
        f"server's own by a median {d['client_overhead_ms']:.1f} ms a step, against a TTFT bound of "
        f"{d['ttft_bound_ms']:.0f} ms: too small to matter, and the fit's per-request cost covers it.",
        f"- Arrivals: the simulator releases each step's requests at the drive's own seeded times: a recorded "
        f"send time is a median {1000 * d['arrival_gaps_s'][0]:.0f} ms (at most {1000 * d['arrival_gaps_s'][1]:.0f} "
        "ms) from its simulated release, so the arrival process is the same in both.",
        f"- Prefix cache: the counters show a median hit rate of {cache['small_hit']:.2f} in the smallest KV pools "
        f"({cache['small_kv_tokens']} tokens) and {cache['large_hit']:.2f} in the largest "
        f"({cache['large_kv_tokens']}), "
        f"with {cache['preemptions']:.0f} preemptions over all steps: "
        + ("the simulator's cache, which never evicts, is not what the table's small pools did differently."
           if not cache["preemptions"] else
           "the small pools preempted requests, which the simulator does too, while its cache never evicts."),
        f"- The fitted latencies: on the recorded steps the fit simulates TTFT a median "
        f"{_pct(math.expm1(bias['ttft']))} and the decode time {_pct(math.expm1(bias['decode']))} off the measured "
        f"({bias['requests']} requests). Each equation is weighted by 1 / the geometric mean of the measured "
        "and the simulated latency: either alone biases the costs, down or up (docs/search.md).",
        f"- What ends a ladder: {same} of {len(rows)} configs' ladders stop at the same rung under both tiers, "
        "whose latency bounds differ, so there the waiting queue's growth, not a latency bound, ends "
        "them. The model watches every simulated step by the rules of a real one (`watch_offline`: its looks, "
        "the monitor's cuts, the waiting queue the simulator reports) and, as the table's ladders were "
        "climbed, lets a look's early pass stand (`hold=False`; a study's search claims only held passes).",
        f"- The truth's own noise: configs identical in effect, or one config served twice ({pairs}), measured "
        "ladders "
        + ", ".join(f"{t} ratios {d['noise'][t]['ratios']}" for t in TIERS)
        + ". No model of the engine predicts that spread; it bounds what leave-one-out can reach (above).", "",
        "Where it is still wrong:", "",
        f"- A median rung sends {d.get('rung_sent', 0):.0f} requests, and its attainment counts those of its "
        "steady window: a few late requests fail a rung, and a ladder stops at its first failing rung, so a "
        "measured ladder sits below the rate where a step passes half the time; the model predicts that rate.",
        "- The fit explains the token times only to the relative error above: the CPU build's iteration "
        "costs are not linear in what an iteration holds (two cores, shared with the client and other work).",
        "- Largest interactive errors: " + "; ".join(
            f"`{r['config']}` {(r['interactive_predicted'] or 0):.2f} predicted, "
            f"{r['interactive_measured']:.2f} measured" for r in worst) + ".", "",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--skip-search", action="store_true", help="the prediction section alone")
    parser.add_argument("--search-only", action="store_true",
                        help="the search alone, beside the grid's prediction its last run stored")  # fmt: skip
    parser.add_argument("--grid", choices=[*sorted(_table.CAPACITY_GRIDS), *LATENCY_TABLES], default="light")
    parser.add_argument("--render-only", action="store_true", help="re-render the grid's sections from the JSON")
    args = parser.parse_args()
    name = "model" if args.grid == "light" else f"model-{args.grid}"
    draw = render_drives if args.grid in LATENCY_TABLES else render
    if args.render_only:  # the stored run's own stamp stays: a re-render is not a run
        stored = json.loads(JSON_PATH.read_text())[name]
        _report.write_section(name, draw(stored), stored, MD_PATH, JSON_PATH)
        return
    started = _report.stamp()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.grid in LATENCY_TABLES:
        data = {"stamp": started, "grid": args.grid, **predict_drives(_table.load(LATENCY_TABLES[args.grid]))}
        _report.write_section(name, render_drives(data), data, MD_PATH, JSON_PATH)
        print(render_drives(data))
        return
    table = _table.load_capacity(_table.CAPACITY_GRIDS[args.grid][0])
    if args.grid == "light":
        requests = light_requests()
        table = with_ids(table, len(requests))
    else:
        requests = heavy_requests(table)
    if args.search_only:
        stored = json.loads(JSON_PATH.read_text()).get(name) if JSON_PATH.exists() else None
        if not stored or not stored.get("prediction"):
            raise SystemExit(f"bench_model --search-only: no stored prediction for --grid {args.grid}; run without it")
        # the prediction keeps the stamp of the run that made it
        prediction = {"stamp": stored["stamp"], **stored["prediction"]}
    else:
        prediction = predict_table(table, requests)
    searched = {} if args.skip_search else search(table, _table.plan_of(table, ("interactive",)), args.seeds,
                                                  requests)  # fmt: skip
    data = {"stamp": started, "seeds": args.seeds, "grid": args.grid, "table": _table.CAPACITY_GRIDS[args.grid][1].name,
            "prediction": prediction, "search": searched}  # fmt: skip
    text = render(data)
    _report.write_section(name, text, data, MD_PATH, JSON_PATH)
    print(text)


def predict_table(table: dict[str, Any], requests: StudyRequests) -> dict[str, Any]:
    """Leave one config out over the table's served configs, with the truth's noise beside it."""
    plan = _table.plan_of(table, TIERS)
    brackets = {k: {t: _table.ladder_bracket(p["rungs"], plan, t) for t in TIERS}
                for k, p in table["points"].items() if not p["failure"]}  # fmt: skip
    truth = {k: {t: bracket[0] for t, bracket in tiers.items()} for k, tiers in brackets.items()}  # the answers
    again = {k: {t: _table.ladder_capacity(rows[0]["rungs"], plan, t) for t in TIERS}
             for k, rows in table.get("repeats", {}).items() if rows and not rows[0]["failure"]}  # fmt: skip
    prediction = leave_one_out(served_of(table, requests.blocks), truth, plan, device_of(table), requests, brackets,
                               again)  # fmt: skip
    prediction["measured"] = _table.served_when(table)
    return prediction


# ---- the latency table: closed-loop drives ----


def drives_served(table: dict[str, Any], requests: StudyRequests) -> dict[str, Served]:
    """The latency table's served configs, each with its one closed-loop drive as a step. The drive's
    clients took the workload's requests in order, so a row's place in send order names its request."""
    out = {}
    for k, p in table["points"].items():
        if p["failure"] or not p["request_log"]:
            continue
        rows = sorted(p["request_log"], key=lambda r: float(r["sent_s"]))
        ids = [str(i % len(requests)) for i in range(len(rows))]
        rows = [{**r, "request_id": i, "blocks": requests.blocks.get(i)} for r, i in zip(rows, ids, strict=True)]
        m = p["metrics"]
        step = Measured(float(m["request_throughput_req_s"]), rows, [], float(m["duration_s"]), dict(p["server"]))
        kv = parse_facts("\n".join(p["memory_lines"])).get("kv_tokens")
        out[k] = Served("vllm", p["params"], None if kv is None else int(kv), (step,))
    return out


def _decode(step: Measured) -> dict[str, float]:
    """What a decode iteration of the drive took: the median time per output token after the first,
    times the tokens a step emitted (1, or in the share of steps that proposed, the mean accepted run
    and the bonus token), as the counters say."""
    done = [r for r in step.rows if r.get("done_s") is not None and r.get("first_s") is not None]
    gaps = [(float(r["done_s"]) - float(r["first_s"])) / (int(r["output_tokens"]) - 1)
            for r in done if int(r["output_tokens"] or 0) > 1]  # fmt: skip
    run, share = step.server.get("spec_mean_accept_len"), step.server.get("spec_draft_share")
    proposing = 1.0 if share is None else float(share)
    per_step = 1.0 if run is None else proposing * float(run) + 1.0 - proposing
    return {"tpot_median_ms": 1000 * statistics.median(gaps) if gaps else math.nan, "tokens_per_step": per_step}


def drive_requests(table: dict[str, Any]) -> StudyRequests:
    """A latency table's requests: the first table's from the prefixes file, a later one's rebuilt by
    today's preset (each checked against the digest the table recorded)."""
    if table["workload"]["digest"] == json.loads(PREFIXES.read_text())["digest"]:
        return light_requests()
    return preset_requests(table)


def predict_drives(table: dict[str, Any]) -> dict[str, Any]:
    """Leave one config out over the latency table: fitted on every other config's drive, the model
    predicts this config's drive (``EngineModel.drive_rows``: the same requests, the same clients) and
    both are scored as the objectives score a drive, under the search benchmark's SLO."""
    requests = drive_requests(table)
    served = drives_served(table, requests)
    n, clients = int(table["workload"]["requests"]), int(table["workload"]["concurrency"])
    plan = _table.plan_of(_table.load_capacity(), TIERS)  # the model's capacity plan, unused by a drive
    adapters, device = {"vllm": VllmAdapter()}, device_of(table)
    began = time.time()
    full = EngineModel.fit(list(served.values()), adapters, device, plan, requests)
    fit_s = time.time() - began
    rows: list[dict[str, Any]] = []
    for k, s in served.items():
        model = EngineModel.fit([o for kk, o in served.items() if kk != k], adapters, device, plan, requests,
                                full.fits)  # fmt: skip
        drive = model.drive_rows("vllm", s.params, s.kv_tokens, n, clients)
        measured = _table.trial_metrics(list(s.steps[0].rows), bench_search.SLO)
        predicted = _table.trial_metrics(drive, bench_search.SLO) if drive else {}
        rows.append({"config": k, **{f"{m}_measured": measured[m] for m in DRIVE_METRICS},
                     **{f"{m}_predicted": predicted.get(m) for m in DRIVE_METRICS}, **_decode(s.steps[0])})  # fmt: skip
        share = model.shares.get("vllm", {}).get(proposer_of(s.params) or "")
        if share is not None:  # the same prediction with every step proposing, as before the share
            blind = replace(model, shares={}).drive_rows("vllm", s.params, s.kv_tokens, n, clients)
            rows[-1]["share"] = share
            every = _table.trial_metrics(blind, bench_search.SLO) if blind else {}
            rows[-1]["output_throughput_tok_s_every_step"] = every.get("output_throughput_tok_s")
        print(f"drive {k}: " + ", ".join(f"{m} {predicted.get(m, math.nan):.3g} vs {measured[m]:.3g}"
                                         for m in DRIVE_METRICS), flush=True)  # fmt: skip
    summary = {}
    for m in DRIVE_METRICS:
        pairs = [(float(r[f"{m}_predicted"]), float(r[f"{m}_measured"])) for r in rows
                 if r[f"{m}_predicted"] is not None and r[f"{m}_measured"] > 0]  # fmt: skip
        errors = [p / t - 1 for p, t in pairs]
        summary[m] = {
            "within": sum(1 for e in errors if abs(e) <= WITHIN), "configs": len(rows), "predicted": len(pairs),
            "median_error": statistics.median(errors) if errors else math.nan,
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else math.nan,
            "spearman": spearman([p for p, _ in pairs], [t for _, t in pairs]),
        }  # fmt: skip
    return {"rows": rows, "summary": summary, "fit": full.fits["vllm"].as_dict(), "fit_s": round(fit_s, 1),
            "hit_rate": full.hit, "acceptance": full.acceptance.get("vllm", {}), "clients": clients,
            "requests": n, "measured": table["machine"]["date_utc"], "served": len(served),
            "space": table.get("what", "grid-cpu.yaml").split("search_spaces/")[-1].split(",")[0],
            "size": len(table["points"])}  # fmt: skip


def _families(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Predicted / measured output throughput per proposer (``none`` without speculation) and sequence limit."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        p, predicted = json.loads(r["config"]), r["output_throughput_tok_s_predicted"]
        if predicted is None or not r["output_throughput_tok_s_measured"]:
            continue
        proposer = proposer_of(p) or "none"
        key = (proposer, str(p.get("max_num_seqs", "default")))
        ratios.setdefault(key, []).append(predicted / r["output_throughput_tok_s_measured"])
    return [[proposer, seqs, str(len(v)), f"{statistics.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}"]
            for (proposer, seqs), v in sorted(ratios.items())]  # fmt: skip


def _twins(rows: list[dict[str, Any]], metric: str) -> list[str]:
    """How far one drive is from a near twin's: configs that differ only in the chunk (1024 or 2048) or only
    in the memory fraction (0.6 or 0.95), each measured once."""
    measured = {json.dumps(json.loads(r["config"]), sort_keys=True): r[f"{metric}_measured"] for r in rows}
    logs = []
    for key, value in measured.items():
        p = json.loads(key)
        for param, one, other in (("chunk_size", 1024, 2048), ("memory_fraction", 0.6, 0.95)):
            twin = measured.get(json.dumps({**p, param: other}, sort_keys=True)) if p.get(param) == one else None
            if twin and value:
                logs.append(abs(math.log(value / twin)))
    within = sum(1 for x in logs if math.expm1(x) <= WITHIN)
    return [str(len(logs)), f"{within}/{len(logs)}", f"{statistics.median(logs):.2f}" if logs else "n/a"]


def _batch_growth(rows: list[dict[str, Any]]) -> str:
    """What four sequences add to a decode iteration over two, per proposer and K (ms), from the rows'
    iteration times (``_decode``)."""
    by: dict[tuple[str, int], dict[int, float]] = {}
    for r in rows:
        p = json.loads(r["config"])
        if "max_num_seqs" in p and r["tpot_median_ms"] > 0.5:  # a near-zero time per token is a burst, not a decode
            key = (proposer_of(p) or "none", int(p.get("num_speculative_tokens") or 0))
            by.setdefault(key, {})[int(p["max_num_seqs"])] = r["tokens_per_step"] * r["tpot_median_ms"]
    growth = [f"{who}{f' K={k}' if k else ''} {t[4] - t[2]:+.1f}" for (who, k), t in sorted(by.items())
              if 2 in t and 4 in t]  # fmt: skip
    return ", ".join(growth) or "no pair measured"


def _captured_share() -> str:
    """The share of decode steps n-gram proposed in, in the CPU capture the adapter's test reads."""
    folder = _report.ROOT / "tests" / "data" / "captures" / "vllm-0.32-cpu"
    first, last = (parse_prometheus((folder / f"metrics-ngram-k4-{w}.prom").read_text()) for w in ("first", "last"))
    share = VllmAdapter().server_stats(first, last)["spec_draft_share"]
    return "none" if not share else f"about one in {round(1 / share)}"


def _share_lines(data: dict[str, Any]) -> list[str]:
    """The n-gram table: each speculative config's throughput predicted with the share of decode steps
    its proposer proposed in (learned from the other configs), and with every step proposing."""
    rows = [r for r in data["rows"] if "share" in r]
    table = [[r["config"], f"{r['share']:.2f}", f"{r['output_throughput_tok_s_measured']:.0f}",
              f"{(r['output_throughput_tok_s_predicted'] or 0):.0f}",
              f"{(r['output_throughput_tok_s_every_step'] or 0):.0f}"] for r in rows]  # fmt: skip
    lookups = [r for r in rows if r["share"] < 1.0]  # where the share changes the prediction
    errors = {key: [abs(math.log((r[key] or 1e-9) / r["output_throughput_tok_s_measured"])) for r in lookups]
              for key in ("output_throughput_tok_s_predicted", "output_throughput_tok_s_every_step")}  # fmt: skip
    med = {key: math.expm1(statistics.median(v)) if v else math.nan for key, v in errors.items()}
    drafted = sorted({round(r["share"], 3) for r in rows if r not in lookups})
    return [
        "The share of decode steps that proposed (`spec_draft_share`, recorded by the vLLM adapter) changes "
        "what the model predicts for each speculative config: output throughput (tok/s) measured, predicted "
        "with the proposer's share as the other configs showed it, and predicted as before the share, every "
        f"step proposing. Over the {len(lookups)} configs whose proposer proposed in fewer than every step, the "
        f"median error of the throughput is {_pct(med['output_throughput_tok_s_predicted'], '')} with the share "
        f"and {_pct(med['output_throughput_tok_s_every_step'], '')} without. A draft model proposes in every "
        f"step, and its configs' recorded share is {', '.join(f'{x:g}' for x in drafted) or 'none'}: a check of "
        "how the adapter counts decode steps.", "",
        _report.table(["config", "share (the others')", "measured", "predicted", "every step proposing"], table),
        "", "Where it is still wrong: a decode iteration's time, from each drive (median time per token after "
        "the first, times the tokens a step emitted as the counters say), against its sequence limit:", "",
        _report.table(["config", "max_num_seqs", "tokens a step", "iteration ms"],
                      [[r["config"], str(json.loads(r["config"]).get("max_num_seqs", "default")),
                        f"{r['tokens_per_step']:.2f}", f"{r['tokens_per_step'] * r['tpot_median_ms']:.1f}"]
                       for r in sorted(data["rows"], key=lambda r: r["config"])]), "",
        "Four sequences against two, the same proposer and K, add to an iteration (ms): "
        f"{_batch_growth(data['rows'])}. "
        "Where a draft model adds as much at every K and more than the other configs do, that is a cost per "
        "speculating sequence, not per drafted token (which would grow with K) nor per target sequence "
        "(which the plain configs bound). The model's "
        "drafting costs are a pass and a drafted token, so it puts that cost nowhere and predicts the draft "
        "configs at four sequences too fast. A time per token near zero is the CPU build's stream arriving "
        "in bursts (the API server shares two cores with the engine), not a decode.", "",
        _fit_line(data, "drives'"), "",
    ]  # fmt: skip


def render_drives(data: dict[str, Any]) -> str:
    fit = data["fit"]
    labels = {"ttft_p95_ms": "TTFT p95", "output_throughput_tok_s": "output throughput",
              "goodput_req_s": "goodput"}  # fmt: skip
    slo = ", ".join(f"{k} <= {v:g}" for k, v in bench_search.SLO.items())
    worst = sorted(data["rows"], key=lambda r: -abs(math.log(max(r["ttft_p95_ms_predicted"] or 1e-9, 1e-9)
                                                             / max(r["ttft_p95_ms_measured"], 1e-9))))[:3]  # fmt: skip
    grid = data.get("grid", "latency")
    first = grid == "latency"
    title = "the latency table" if first else "the n-gram table"
    lines = [
        f"## The performance model on {title}: closed-loop drives (`tests/benchmarks/bench_model.py "
        f"--grid {grid}`)", "",
        f"The table `tests/benchmarks/data/{LATENCY_TABLES[grid].name}` (`{data.get('space', 'grid-cpu.yaml')}`, "
        f"measured {data['measured']}; "
        f"{data['served']} of {data['size']} configs served): every config driven once closed loop, "
        f"{data['clients']} clients sending the rag preset's {data['requests']} requests in turn, as the objectives "
        "other than capacity (goodput, throughput, pareto) measure a trial. Leave one config out: the model is "
        "fitted on every other config's drive and predicts this one's (`EngineModel.drive_rows`: the simulated "
        "scheduler sends each client's next request the moment its last one ends); both drives are scored as "
        f"the objectives score them (`running_values`), under the search benchmark's SLO ({slo}). The 20 % "
        "yardstick is the issue's, set there for capacity.", "",
        _report.table(["metric", "within 20 %", "predicted", "median error", "median abs error",
                       "rank correlation (Spearman)"],
                      [[labels[m], f"{v['within']}/{v['configs']}", f"{v['predicted']}/{v['configs']}",
                        _pct(v["median_error"]), _pct(v["median_abs_error"], ""), f"{v['spearman']:.2f}"]
                       for m, v in data["summary"].items()]), "",
    ]  # fmt: skip
    if not first:
        lines += _share_lines(data)
        return "\n".join(lines) + "\n"
    lines += [
        "The table's own noise: each config was driven once, for about three seconds, and a TTFT p95 of 40 "
        "requests is their second slowest. Configs that differ only in the chunk (1024 or 2048, both above "
        "every prompt of the preset) or only in the memory fraction (0.6 or 0.95) measured:", "",
        _report.table(["metric", "pairs", "within 20 % of each other", "median |log ratio|"],
                      [[labels[m], *_twins(data["rows"], m)] for m in DRIVE_METRICS]), "",
        "Where near twins disagree by more than 20 %, no prediction can be within 20 % of both: TTFT p95 and "
        "goodput on this table are mostly the draw of one drive, and output throughput is the measure the "
        "model can be judged on here.", "",
        "Predicted over measured output throughput by proposer and sequence limit (median, range; "
        "speculation's acceptance and K as the counters show them):", "",
        _report.table(["proposer", "max_num_seqs", "configs", "median", "range"], _families(data["rows"])), "",
        "Where the model is wrong here, and why, as far as this table tells:", "",
        "- n-gram lookup: vLLM counts a draft only in a step that scheduled speculative tokens for the "
        "request (`Scheduler.make_spec_decoding_stats`), so the acceptance its counters give is that of the "
        "steps where the lookup found a match. The model credits it on every step; where the lookup found "
        "none the step emits one token. The adapter now records the share of decode steps that proposed "
        "(`spec_draft_share`, from `vllm:generation_tokens_total` beside the draft counters) and the model "
        "learns it per draft, as it learns acceptance; this table predates it, so here every step proposes. "
        f"On a real CPU server under today's rag preset, n-gram at K=4 proposed in {_captured_share()} of its "
        "decode steps (`tests/data/captures/vllm-0.32-cpu/metrics-ngram-k4-*.prom`); what the share does to the "
        "model's n-gram predictions, on a table that recorded it, is the n-gram table's section.",
        f"- Four sequences against two: the fit gives tokens {fit['target']['token']:.3g} s and sequences "
        f"{fit['target']['sequence']:.3g} s, so a batch of four costs the model what a batch of two does; "
        f"the fixed per-request {1000 * fit['overhead_s']:.0f} ms and the attention term carry the prompts "
        "instead. On the capacity tables, whose steps ran many rates, the same fit found a token cost "
        "(the sections above): one drive per config at one load does not separate them.",
        "- TTFT p95: the under-prediction is mostly stalls of one drive (in the largest errors below, the "
        "requests in flight at one moment all waited about a second for their first token, where a near twin's "
        "slowest waited a fifth of that or less), which no deterministic simulation gives.", "",
        "Largest TTFT p95 errors: " + "; ".join(
            f"`{r['config']}` {(r['ttft_p95_ms_predicted'] or 0):.0f} ms predicted, "
            f"{r['ttft_p95_ms_measured']:.0f} ms measured" for r in worst) + ".", "",
        _fit_line(data, "drives'"), "",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
