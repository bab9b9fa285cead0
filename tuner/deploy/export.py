"""Exporting a study's best trials as launch files: a manifest per trial, rendered in each format.

The ``*.json`` manifest holds everything known of the trial; the other formats render it: ``sh``
(``tuner.deploy.formats``), ``python`` (``tuner.deploy.formats``), ``compose`` and ``k8s``
(``tuner.deploy.formats``), each under the same provenance header. Before anything is written, every argv
is checked by the engine's own parser (``tuner.deploy.verify``); a rejected one fails the export and writes
nothing, and so does an interruption while writing (``tuner.deploy.atomic.write_all``). The command comes
from the trial's ``launch`` attribute, field by field: no argv is split here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner.deploy import verify
from tuner.deploy.atomic import write_all
from tuner.deploy.formats import render_compose, render_k8s, render_python, render_sh
from tuner.deploy.provenance import provenance
from tuner.engines import ADAPTERS
from tuner.engines import env as env_probe
from tuner.errors import ExportError
from tuner.naming import safe_name
from tuner.study.attrs import constraint_violation, step_at_capacity, trial_attrs
from tuner.study.cost import PRICE_ATTR, tok_s_per_gpu, usd_per_million_tokens
from tuner.study.feasible import feasible_pareto
from tuner.version import __version__


def select_trials(study: optuna.Study, numbers: list[int] | None) -> list[optuna.trial.FrozenTrial]:
    if not numbers:
        front = feasible_pareto(study)
        if not front:
            raise ExportError(f"study {study.study_name!r} has no feasible trial to export")
        return front
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    chosen = []
    for n in numbers:
        t = trials.get(n)
        if t is None:
            raise ExportError(f"study {study.study_name!r} has no trial {n}")
        if t.state != optuna.trial.TrialState.COMPLETE or constraint_violation(t)[0] > 0:
            metrics = trial_attrs(t).get("metrics") or {}
            why = trial_attrs(t).get("failure") or (
                f"error rate {metrics['error_rate']:.3f}" if "error_rate" in metrics else t.state.name
            )
            raise ExportError(f"trial {n} is infeasible ({why}): not exported")
        chosen.append(t)
    return chosen


def manifest(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    attrs, sattrs = trial.user_attrs, study.user_attrs
    launch = stored_launch(trial)
    engine = attrs["engine"]
    return {
        "tuner_version": __version__,
        "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "study": study.study_name,
        "trial": trial.number,
        "config_kind": attrs.get("config_kind"),
        "engine": engine,
        "engine_version": attrs.get("engine_version"),
        "distribution": sattrs.get("engines", {}).get(engine, {}).get("distribution"),
        "hardware": sattrs.get("hardware"),
        "model": sattrs.get("model"),
        "workload": sattrs.get("workload"),
        "workload_digest": sattrs.get("workload_digest"),
        "params": trial.params,
        "objectives": {
            "ttft_p95_ms": attrs.get("ttft_p95_ms"),
            "output_throughput_tok_s": attrs.get("output_throughput_tok_s"),
        },
        "metrics": attrs.get("metrics"),
        "ci": attrs.get("ci"),  # the trial's own 95 % intervals (tuner.measure.statistics)
        "stress": (sattrs.get("stress") or {}).get(str(trial.number)),
        "repeats": next((f for f in sattrs.get("finalists", []) if f["trial"] == trial.number), None),
        "verdict": sattrs.get("verdict"),
        "server": attrs.get("server"),
        **_capacity(attrs),
        **_cost(attrs, sattrs.get(PRICE_ATTR)),
        "module": launch["module"],
        "python": launch["python"],
        "argv": list(launch["args"]),  # the engine's own flags: each format adds its address
    }


def _capacity(attrs: dict[str, Any]) -> dict[str, Any]:
    """A capacity trial's claim: each tier's capacity, its SLO and the attainment target (none otherwise)."""
    searched = (attrs.get("capacity") or {}).get("tiers") or {}
    if not searched:
        return {}
    tiers = {
        tier: {
            "capacity_req_s": s.get("capacity_req_s"),
            "slo": s.get("slo"),
            "attainment_target": s.get("target"),
            "bracket_req_s": s.get("bracket_req_s"),
            "attainment_interval": s.get("attainment_interval"),
            # the step the capacity was decided at, so its attainment goes with its interval
            "steps": [at] if (at := step_at_capacity(s)) is not None else [],
        }  # fmt: skip
        for tier, s in searched.items()
    }
    return {"capacity": {"objective_tier": attrs["capacity"].get("objective_tier"), "tiers": tiers}}


def _cost(attrs: dict[str, Any], price: float | None) -> dict[str, Any]:
    """Each tier's output tokens/s per GPU at its capacity and, with a price, dollars per million tokens."""
    tiers = ((attrs.get("capacity") or {}).get("tiers") or {}).keys()
    found = {
        tier: {"output_tok_s_per_gpu": per_gpu, "usd_per_million_output_tokens": usd_per_million_tokens(per_gpu, price)}
        for tier in tiers
        if (per_gpu := tok_s_per_gpu(attrs, tier)) is not None
    }
    return {"cost": {"gpu_price_usd_per_hour": price, "tiers": found}} if found else {}


def stored_launch(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The launch the trial stored (``LaunchSpec.stored``); a trial of an older tuner has only its argv."""
    launch = trial_attrs(trial).get("launch")
    if not isinstance(launch, dict):
        raise ExportError(
            f"trial {trial.number} was recorded by an older tuner, which kept its command only as an argv: "
            "measure the config again with this tuner to export it"
        )
    return launch


def safe_stem(study: str, number: int) -> str:
    """A file name that cannot leave the output folder, whatever the study is called."""
    return safe_name(study) + f"-trial{number}"


RENDERERS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "sh": (".sh", lambda m: render_sh(m)),
    "json": (".json", lambda m: json.dumps(m, indent=2) + "\n"),
    "python": (".py", lambda m: render_python(m, provenance(m))),
    "compose": (".compose.yaml", lambda m: render_compose(m, provenance(m))),
    "k8s": (".k8s.yaml", lambda m: render_k8s(m, provenance(m))),
}


def export_study(
    study: optuna.Study,
    numbers: list[int] | None,
    out_dir: Path,
    engine_envs: dict[str, str] | None = None,
    formats: list[str] | None = None,
) -> list[Path]:
    """Check every selected trial's argv with its engine's parser, then write its launch files:
    ``formats`` (sh, compose, k8s, python, json), by default the engine's own (its adapter's
    ``export_formats``)."""

    manifests = [manifest(study, t) for t in select_trials(study, numbers)]
    for engine in sorted({m["engine"] for m in manifests}):
        mine = [m for m in manifests if m["engine"] == engine]
        env = env_probe.probe(ADAPTERS[engine](), Path((engine_envs or {}).get(engine) or mine[0]["python"]))
        for m, verdict in zip(mine, verify.check_argvs(env, [m["argv"] for m in mine]), strict=True):
            if not verdict["ok"]:
                raise ExportError(f"trial {m['trial']}: {engine} {env.version} rejects the command: {verdict['error']}")
            m["parser_check"] = {"engine_version": env.version, **verdict}
    files: list[tuple[Path, str]] = []
    for m in manifests:  # render every file first: a failure must leave no half-written export
        stem = out_dir / safe_stem(m["study"], m["trial"])
        chosen = formats or list(ADAPTERS[m["engine"]]().export_formats)
        for fmt in dict.fromkeys(chosen):
            suffix, render = RENDERERS[fmt]
            files.append((stem.with_name(stem.name + suffix), render(m)))
    return write_all(out_dir, files)
