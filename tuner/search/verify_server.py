"""``tuner verify``: a claimed capacity checked with the serving engine's own benchmark client.

The server at ``--url`` is asked what serves it (``/v1/models``' ``owned_by``), and that engine's
adapter gives its client's command (``tuner.engines``: nothing here names an engine). The client
sends a trial's capacity step's requests (the same workload, seed and tokenizer, the pool cycled in
the same order, ``tuner.measure.rate_steps.step_requests``) open loop at the claimed rate and at
``OVER_SHARE`` times it, and each tier's attainment is computed from its per-request output by the
trial's own ``summarize_step`` (``tuner.measure.verify``). The goal: at the claim at most
``GOAL_SLACK`` below the target, and below the target at ``OVER_SHARE`` times it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import optuna

from tuner.deploy.export import manifest, safe_stem, stored_launch
from tuner.deploy.formats import render_sh
from tuner.deploy.verify import read_launch_file
from tuner.engines import ADAPTERS
from tuner.engines.base import Device, EngineAdapter, LaunchSpec
from tuner.engines.env import probe
from tuner.errors import ConfigError, ExportError, TunerError
from tuner.measure.process import ServerProcess, free_port
from tuner.measure.rate_steps import step_requests
from tuner.measure.supply import RequestSupply
from tuner.measure.trial import identify_server, reset_prefix_cache
from tuner.measure.verify import MAX_EXTRA_S, QueueWatch, client_requests, judge, read_result, run_client
from tuner.progress import Progress
from tuner.search.drive_server import drive_model, served_model
from tuner.search.options import SearchOptions
from tuner.search.resolve import capacity_plan, resolve_workload
from tuner.study.attrs import study_attrs_of, trial_attrs
from tuner.study.feasible import feasible_trials
from tuner.study.verdict import verdicts_by_metric
from tuner.workloads import source
from tuner.workloads.base import Request

__all__ = [
    "GOAL_SLACK",
    "OVER_SHARE",
    "Claim",
    "describe_report",
    "exported_launch",
    "tier_winners",
    "trial_claims",
    "verify_claims",
    "verify_launch_file",
    "verify_trial",
    "verify_url",
    "verify_winners",
]

OVER_SHARE = 1.2  # the second rate, as a share of the claim: attainment must fall below the target there
GOAL_SLACK = 0.05  # at the claim, attainment may be this far below the target


def verify_url(
    opts: SearchOptions, url: str, rate: float, tiers_for: str, duration_s: float | None, progress: Progress,
    work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the engine's client at ``rate`` and ``OVER_SHARE * rate`` on the server at ``url``, every
    scored tier judged at that one claim."""
    if not rate > 0:
        raise ConfigError(f"--rate {rate}: a claimed capacity must be above 0 req/s")
    return verify_claims(opts, url, None, rate, tiers_for, duration_s, progress, work_dir)


def verify_claims(
    opts: SearchOptions, url: str, claims: Mapping[str, Claim] | None, rate: float | None, tiers_for: str,
    duration_s: float | None, progress: Progress, work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Each tier's claim (``claims``: a trial's own rate, SLO and target per tier; None: ``rate`` for
    every scored tier of the options' plan) at 1x and ``OVER_SHARE`` x, one client run per rate."""
    url = url.rstrip("/")
    given = source(opts.workload)
    device = Device("cpu" if tiers_for == "cpu" else "cuda", url, 0)
    with httpx.Client(timeout=10.0) as client:
        served = served_model(client, url)
        model = drive_model(opts, served, url)
        owner = next(iter(identify_server(client, url).get("owned_by") or []), "")
        if owner not in ADAPTERS:
            raise ConfigError(f"--url {url}: served by {owner or 'an unknown engine'!r}; verify knows "
                              f"the clients of {', '.join(ADAPTERS)}")  # fmt: skip
        adapter = ADAPTERS[owner]()
        env = probe(adapter, Path(opts.engine_envs[owner]) if owner in opts.engine_envs else None)
        workload = resolve_workload(opts, model, given)
        plan = capacity_plan(opts, workload, device)
        assert plan is not None  # opts.objective is a capacity objective
        # one run per rate, as long as a trial's step may serve (or --duration-s), no looks: the client
        # runs to its end; its requests come from one supply, so every run sends distinct requests
        plan = dataclasses.replace(
            plan, min_step_s=duration_s if duration_s is not None else plan.min_step_s * plan.step_limit, step_limit=1
        )
        supply = RequestSupply.of(workload)
        if claims is None:
            assert rate is not None
            claims = {name: Claim(rate, dict(plan.tiers[name]), plan.target) for name in plan.scored}
        by_rate: dict[float, dict[str, Claim]] = {}
        for tier, claim in claims.items():
            by_rate.setdefault(claim.rate_req_s, {})[tier] = claim
        with tempfile.TemporaryDirectory(prefix="tuner-verify-") as scratch:
            run = _Run(adapter, env.python, url, served.name, model.path, work_dir or Path(scratch), opts.seed)
            runs = []
            for claimed, tiers in by_rate.items():
                for share in (1.0, OVER_SHARE):
                    reset = reset_prefix_cache(client, url, adapter)  # each rate starts as cold as a trial's step
                    pool, _ = step_requests(supply, claimed * share, plan)
                    progress.line(f"{share:g}x {claimed:.4g}: {claimed * share:.4g} req/s, {adapter.name}'s own client")
                    found = run.at(share, claimed * share, pool, tiers)
                    runs.append({"claimed_rate_req_s": claimed, **found, "prefix_cache_reset": reset})
    return {"url": url, "model": served.name, "engine": owner, "engine_version": env.version,
            "workload": workload.name, "workload_digest": workload.digest(), "tokenizer": model.path,
            "claims": {t: dataclasses.asdict(c) for t, c in claims.items()}, "goal_slack": GOAL_SLACK,
            "runs": runs}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Claim:
    """One tier's claimed capacity, with the SLO and attainment target it was claimed under."""

    rate_req_s: float
    slo: dict[str, float]
    target: float


@dataclasses.dataclass(frozen=True)
class _Run:
    """One client run's fixed parts: the engine, its Python, the server and where the files go."""

    adapter: EngineAdapter
    python: str
    url: str
    served: str
    tokenizer: str  # the model folder: the name the server serves may be no path here
    where: Path
    seed: int

    def at(self, share: float, rate: float, pool: list[Request], claims: Mapping[str, Claim]) -> dict[str, Any]:
        chosen = client_requests(pool, self.adapter)
        name = f"at-{rate:.4g}"  # one name per rate: a trial's tiers may claim different rates
        dataset, result = self.where / f"dataset-{name}.json", self.where / f"result-{name}.json"
        dataset.write_text(self.adapter.bench_dataset(chosen.prompts, chosen.output_lens))
        n = len(chosen.prompts)
        argv = self.adapter.bench_argv(self.python, self.url, self.served, self.tokenizer, str(dataset), str(result),
                                       rate, n, chosen.output_len, self.seed)  # fmt: skip
        with QueueWatch(self.url, self.adapter.waiting_gauge) as queue:
            run_client(argv, self.where / f"client-{name}.log", timeout_s=n / rate + MAX_EXTRA_S)
        bench = read_result(result, self.adapter)
        verdicts = {tier: judge(rate, bench, {tier: c.slo}, c.target)[tier] for tier, c in claims.items()}
        goal = {tier: _goal(share, v["attainment"], claims[tier].target) for tier, v in verdicts.items()}
        # the server's waiting queue while the client sent (its last send, else its schedule): attainment
        # over one step's length cannot show a queue still building at its end (None: no such gauge)
        send_s = max(float(r["sent_s"]) for r in bench.rows) if bench.timed and bench.rows else n / rate
        kept = queue.window(bench.duration_s, send_s)
        return {"share": share, "rate_req_s": rate, "argv": argv, "notes": chosen.notes, "tiers": verdicts,
                "goal_met": goal, "queue_growing": queue.growing(kept, rate),
                "queue_waiting": [round(n, 1) for _, n in kept]}  # fmt: skip


def _goal(share: float, attainment: float, target: float) -> bool:
    return attainment >= target - GOAL_SLACK if share == 1.0 else attainment < target


def trial_claims(trial: optuna.trial.FrozenTrial) -> dict[str, Claim]:
    """Each tier's capacity the trial recorded (``capacity`` attribute), with its SLO and target; a
    tier it found no capacity for (0 req/s) has nothing to verify."""
    tiers = (trial_attrs(trial).get("capacity") or {}).get("tiers") or {}
    claims = {tier: Claim(float(found["capacity_req_s"]), dict(found["slo"]), float(found["target"]))
              for tier, found in tiers.items() if float(found.get("capacity_req_s") or 0) > 0}  # fmt: skip
    if not claims:
        raise ConfigError(f"--trial {trial.number}: it recorded no capacity above 0 req/s to verify")
    return claims


def tier_winners(study: optuna.Study, tiers: Sequence[str]) -> dict[str, int]:
    """Each tier's winner: the top of the finalists' verdict on that tier (the winner, or the first of
    a tie by its repeats' mean) where the study has one and that trial is still feasible; else the
    best feasible trial by the capacity it recorded there (ties: the earlier trial)."""
    feasible = feasible_trials(study)
    numbers = {t.number for t in feasible}
    best: dict[str, int] = {}
    for tier in tiers:
        top = _verdict_top(study, tier, single=len(tiers) == 1)
        if top in numbers:
            best[tier] = top
            continue
        found = [(float((trial_attrs(t).get("metrics") or {}).get(f"capacity_{tier}_req_s") or 0.0), -t.number)
                 for t in feasible]  # fmt: skip
        found = [f for f in found if f[0] > 0]
        if found:
            best[tier] = -max(found)[1]
    return best


def _verdict_top(study: optuna.Study, tier: str, single: bool) -> int | None:
    """The first trial of the finalists' verdict on ``tier`` (``tuner.search.finalists``: by metric in a
    two-tier study; a one-tier study's verdict is on ``capacity_req_s``), or None without one."""
    by_metric = verdicts_by_metric(study_attrs_of(study).get("verdict") or {})
    judged = by_metric.get(f"capacity_{tier}_req_s") or (by_metric.get("capacity_req_s") if single else None)
    trials = (judged or {}).get("trials") or []
    return int(trials[0]) if trials else None


def verify_winners(
    study: optuna.Study, opts: SearchOptions, tiers: Sequence[str], progress: Progress, work_dir: Path
) -> dict[str, Any]:
    """``tuner search --verify``: each tier's winner booted from its exported .sh and checked at its
    capacity by the engine's own client; the reports go in the study's ``verify`` attribute. A trial
    that won several tiers boots once for all of them. A tier that cannot be verified says why there,
    and the others still run. Each boot's reports are stored as it ends, and a search resumed after its
    machine went away (a GPU lease may end between two winners' boots) keeps a tier's stored report
    where the winner is the same trial and it holds no error, and boots only the rest."""
    winners = tier_winners(study, tiers)
    stored = study_attrs_of(study).get("verify") or {}
    found: dict[str, Any] = {
        tier: report for tier, report in stored.items()
        if tier in winners and "error" not in report and report.get("trial") == winners[tier]
    }  # fmt: skip
    for tier in found:
        progress.line(f"verify {tier}: trial {winners[tier]}'s report kept from an earlier run of this study")
    won: dict[int, list[str]] = {}
    for tier, number in winners.items():
        if tier not in found:
            won.setdefault(number, []).append(tier)
    for number, its_tiers in won.items():
        try:
            report = verify_trial(study, number, opts, its_tiers, None, progress, work_dir / f"trial-{number}")
            found.update({tier: tier_report(report, tier) for tier in its_tiers})
        except TunerError as exc:
            found.update({tier: {"study": study.study_name, "trial": number, "error": str(exc)} for tier in its_tiers})
        study.set_user_attr("verify", {tier: found[tier] for tier in tiers if tier in found})
    reports = {t: found.get(t) or {"error": f"no feasible trial found a {t} capacity above 0 req/s"} for t in tiers}
    study.set_user_attr("verify", reports)
    for tier, report in reports.items():
        lines = [f"verify {tier}: {report['error']}"] if "error" in report else describe_report(report)
        for line in lines:
            progress.line(line)
    return reports


def tier_report(report: Mapping[str, Any], tier: str) -> dict[str, Any]:
    """The part of a verify report (one boot, several tiers' claims) that judges ``tier``."""
    runs = [{**run, "tiers": {tier: run["tiers"][tier]}, "goal_met": {tier: run["goal_met"][tier]}}
            for run in report["runs"] if tier in run["tiers"]]  # fmt: skip
    return {**report, "claims": {tier: report["claims"][tier]}, "runs": runs}


def describe_report(report: Mapping[str, Any]) -> list[str]:
    """A verify report in lines: each rate's attainment per tier, what was left out, and the goal."""
    lines = [f"{report['url']} ({report['engine']} {report['engine_version']}), workload {report['workload']}; "
             "attainment by the engine's own client:"]  # fmt: skip
    for run in report["runs"]:
        lines += [f"  note: {note}" for note in run["notes"]]
        for tier, v in run["tiers"].items():
            others = "".join(f", {k} {v[k]}" for k in ("attainment_low", "attainment_high", "decision") if k in v)
            goal = "met" if run["goal_met"][tier] else "missed"
            at = f"{run['share']:g}x {run['claimed_rate_req_s']:.4g} = {run['rate_req_s']:.4g} req/s"
            lines.append(f"  {at} {tier}: {v['attainment']:.3f} of "
                         f"{v['n_counted']} counted ({v['n_requests']} sent), target {v['target']:.2f}, "
                         f"{'pass' if v['passed'] else 'fail'}{others}; goal {goal}")  # fmt: skip
        lines.append(f"  counted at {run['share']:g}x: {next(iter(run['tiers'].values()))['counted']}")
        if run.get("queue_growing") is not None:
            waiting = run.get("queue_waiting") or []
            trend = "kept growing" if run["queue_growing"] else "did not keep growing"
            lines.append(f"  the server's waiting queue {trend} while the client sent at {run['share']:g}x "
                         f"({len(waiting)} samples, {min(waiting):g}-{max(waiting):g} waiting)")  # fmt: skip
    return lines


def verify_trial(
    study: optuna.Study, number: int, opts: SearchOptions, tiers: Sequence[str] | None, duration_s: float | None,
    progress: Progress, work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Boot the trial's exported .sh (written to ``work_dir``, and checked to read back as the recorded
    launch) on a free port (``ServerProcess``: stopped, its whole group, on any exit), and verify the
    recorded capacity of each of ``tiers`` (None: every tier) on it."""
    trial = next((t for t in study.trials if t.number == number), None)
    if trial is None:
        raise ConfigError(f"--trial {number}: study {study.study_name!r} has no such trial")
    claims = trial_claims(trial)
    if tiers is not None:
        if missing := [tier for tier in tiers if tier not in claims]:
            raise ConfigError(f"--tier {missing[0]}: trial {number} recorded no {missing[0]} capacity")
        claims = {tier: claims[tier] for tier in tiers}
    try:
        launch = stored_launch(trial)
    except ExportError as exc:
        raise ConfigError(str(exc)) from exc
    engine = str(trial_attrs(trial).get("engine") or "")
    if engine not in ADAPTERS:
        raise ConfigError(f"--trial {number}: recorded engine {engine!r} is none the tuner knows")
    adapter = ADAPTERS[engine]()
    # the client runs from the environment the trial's server ran from, unless told otherwise
    opts = dataclasses.replace(opts, engine_envs={engine: str(launch["python"]), **opts.engine_envs})
    kind = (study_attrs_of(study).get("hardware") or {}).get("kind", "cuda")
    with tempfile.TemporaryDirectory(prefix="tuner-verify-export-") as scratch:
        # what boots is the trial's exported .sh, read back as `tuner verify FILE` reads one: the command
        # a user deploys, which must be the one the trial measured
        launch_file, module, args = exported_launch(study, trial, work_dir or Path(scratch))
        spec = _spec(adapter, str(launch["python"]), module, args, None)
        report = _boot_and_verify(spec, f"trial {number}", opts, claims, None, "cpu" if kind == "cpu" else "gpu",
                                  duration_s, progress, work_dir)  # fmt: skip
    kept = str(launch_file) if work_dir is not None else None
    return {"study": study.study_name, "trial": number, "launch_file": kept, **report}


def exported_launch(study: optuna.Study, trial: optuna.trial.FrozenTrial, where: Path) -> tuple[Path, str, list[str]]:
    """The trial's exported .sh, written into ``where``, and the module and arguments it reads back as
    (``tuner verify FILE`` reads one so); ``ExportError`` unless they are the launch the trial recorded."""
    where.mkdir(parents=True, exist_ok=True)
    launch, launch_file = stored_launch(trial), where / (safe_stem(study.study_name, trial.number) + ".sh")
    launch_file.write_text(render_sh(manifest(study, trial)))
    module, args, _ = read_launch_file(launch_file)
    if module != launch["module"] or args != [str(a) for a in launch["args"]]:
        raise ExportError(f"trial {trial.number}: its exported .sh reads back as {module} {args}, not the recorded "
                          f"{launch['module']} {launch['args']}")  # fmt: skip
    return launch_file, module, args


def verify_launch_file(
    path: Path, opts: SearchOptions, rate: float, tiers_for: str, duration_s: float | None, progress: Progress,
    work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Boot an exported launch file's command (read back as ``tuner check`` reads it) on a free port
    and verify ``rate`` on it; the engine's Python is the manifest's, else the engine environment's."""
    if not rate > 0:
        raise ConfigError(f"--rate {rate}: a claimed capacity must be above 0 req/s")
    try:
        module, args, python = read_launch_file(path)
    except ExportError as exc:
        raise ConfigError(str(exc)) from exc
    engine = next((name for name, a in ADAPTERS.items() if a.module == module), None)
    if engine is None:
        raise ConfigError(f"{path}: runs {module!r}, no engine the tuner knows")
    adapter = ADAPTERS[engine]()
    if python is None:
        python = probe(adapter, Path(opts.engine_envs[engine]) if engine in opts.engine_envs else None).python
    opts = dataclasses.replace(opts, engine_envs={engine: python, **opts.engine_envs})
    spec = _spec(adapter, python, module, args, None)
    report = _boot_and_verify(spec, str(path), opts, None, rate, tiers_for, duration_s, progress, work_dir)
    return {"launch_file": str(path), **report}


def _spec(adapter: EngineAdapter, python: str, module: str, args: list[Any], env: Any) -> LaunchSpec:
    # the measuring env, as a trial's boot has it: verify empties the prefix cache before each rate
    return LaunchSpec(engine=adapter.name, python=python, module=module, args=tuple(str(a) for a in args),
                      host="127.0.0.1", port=free_port(), env=dict(env or {}), health_path=adapter.health_path,
                      served_model=str(args[1]), ready_line=adapter.ready_line,
                      trial_env=dict(adapter.measuring_env))  # fmt: skip


def _boot_and_verify(
    spec: LaunchSpec, what: str, opts: SearchOptions, claims: Mapping[str, Claim] | None, rate: float | None,
    tiers_for: str, duration_s: float | None, progress: Progress, work_dir: Path | None,
) -> dict[str, Any]:  # fmt: skip
    """``ServerProcess``: a free port, a log, and the whole process group stopped on any exit (Ctrl-C too)."""
    with tempfile.TemporaryDirectory(prefix="tuner-verify-boot-") as scratch:
        log = (work_dir or Path(scratch)) / "server.log"
        with ServerProcess(spec, log) as server:
            progress.line(f"{what}: booting its {spec.engine} command on port {spec.port}")
            server.wait_ready(opts.boot_deadline_s)
            return verify_claims(opts, server.base_url, claims, rate, tiers_for, duration_s, progress, work_dir)
