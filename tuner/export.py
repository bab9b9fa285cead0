"""Launch files: a ``*.sh`` that starts the exact server command, and a ``*.json`` manifest.

Every value is quoted with ``shlex.quote``, so a model path with spaces or quotes, or the JSON of
``--speculative-config``, stays one argument. The interpreter, host and port can be overridden
with ``ENGINE_PYTHON``, ``HOST`` and ``PORT``. Before anything is written, every argv is checked by
the engine's own parser (``tuner.check``); a rejected one fails the export and writes nothing, and
so does an interruption while writing (``tuner.atomic.write_all``).
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner import __version__
from tuner.atomic import write_all
from tuner.deploy import render_compose, render_k8s
from tuner.errors import ExportError
from tuner.launchers import render_python
from tuner.naming import safe_name
from tuner.study import constraint_violation, feasible_pareto

ADDRESS_FLAGS = ("--host", "--port")


def engine_args(argv: list[str]) -> tuple[str, list[str]]:
    """Split ``python -m MODULE args...`` into MODULE and the args without host and port."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ExportError(f"not an engine command: {argv[:3]}")
    args, rest = [], iter(argv[3:])
    for arg in rest:
        if arg in ADDRESS_FLAGS:
            next(rest, None)
        else:
            args.append(arg)
    return argv[2], args


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
            metrics = t.user_attrs.get("metrics") or {}
            why = t.user_attrs.get("failure") or (
                f"error rate {metrics['error_rate']:.3f}" if "error_rate" in metrics else t.state.name
            )
            raise ExportError(f"trial {n} is infeasible ({why}): not exported")
        chosen.append(t)
    return chosen


def manifest(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    attrs, sattrs = trial.user_attrs, study.user_attrs
    module, args = engine_args(list(attrs["argv"]))
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
        "ci": attrs.get("ci"),  # the trial's own 95 % intervals (tuner.intervals)
        "stress": (sattrs.get("stress") or {}).get(str(trial.number)),
        "repeats": next((f for f in sattrs.get("finalists", []) if f["trial"] == trial.number), None),
        "verdict": sattrs.get("verdict"),
        "server": attrs.get("server"),
        "module": module,
        "python": attrs["argv"][0],
        "argv": args,
    }


def _oneline(value: object) -> str:
    """A value fit for a ``#`` comment: a newline there would end the comment and run the rest."""
    return " ".join(str(value).split())


def provenance(m: dict[str, Any]) -> list[str]:
    """Comment lines saying where a launch file came from; every value on one line."""
    objectives = "  ".join(_measured(k, v, (m.get("ci") or {}).get(k)) for k, v in m["objectives"].items()
                           if isinstance(v, int | float))  # fmt: skip
    return [
        f"# Launch file exported by tuner {_oneline(m['tuner_version'])} at {_oneline(m['exported_at'])}",
        f"# study: {_oneline(m['study'])}  trial: {m['trial']} ({_oneline(m['config_kind'])})",
        f"# engine: {_oneline(m['engine'])} {_oneline(m['engine_version'])} ({_oneline(m['distribution'])})",
        f"# hardware: {_oneline(m['hardware']['name'])}",
        f"# model: {_oneline(m['model'])}",
        f"# workload: {_oneline(m['workload'])}  digest: {_oneline(m['workload_digest'])}",
        f"# measured: {objectives}",
        *_repeat_lines(m),
    ]


def _measured(key: str, value: float, ci: dict[str, Any] | None) -> str:
    within = f" [95% CI {ci['low']:.1f}-{ci['high']:.1f}]" if ci else ""
    return f"{key}={value:.1f}{within}"


def _repeat_lines(m: dict[str, Any]) -> list[str]:
    """The finalist repeats' means and 95 % intervals, and the verdict, when the study has them."""
    lines = []
    for metric, s in ((m.get("repeats") or {}).get("stats") or {}).items():
        lines.append(f"# repeats {metric}: mean {s['mean']:.1f}, 95% CI [{s['low']:.1f}, {s['high']:.1f}], n={s['n']}")
    stress = m.get("stress")
    if stress and stress.get("ran"):
        ttft = stress.get("ttft_p95_ms")
        seen = f"TTFT p95 {ttft:.1f} ms" if isinstance(ttft, int | float) else "no request served"
        lines.append(f"# stress check: {stress['prompt_tokens']} prompt tokens x concurrency {stress['concurrency']}, "
                     f"cold cache: {seen}, {_oneline(stress.get('failure') or 'passed')}")  # fmt: skip
    verdict = m.get("verdict")
    if verdict:
        trials = ", ".join(str(t) for t in verdict["trials"])
        lines.append(f"# verdict: {_oneline(verdict['kind'])} on {_oneline(verdict['metric'])}: trials {trials}")
    return lines


def render_sh(m: dict[str, Any]) -> str:
    header = [
        "#!/usr/bin/env bash",
        *provenance(m),
        "# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.",
        "set -euo pipefail",
        f"ENGINE_PYTHON=${{ENGINE_PYTHON:-{shlex.quote(m['python'])}}}",
        "HOST=${HOST:-127.0.0.1}",
        "PORT=${PORT:-8000}",
    ]
    lines = [f'exec "$ENGINE_PYTHON" -m {shlex.quote(m["module"])}']
    lines += [f"  {shlex.quote(a)}" for a in m["argv"]]
    lines.append('  --host "$HOST" --port "$PORT"')
    return "\n".join(header) + "\n" + " \\\n".join(lines) + "\n"


def read_sh(text: str) -> tuple[str, list[str]]:
    """The module and engine args of an exported ``*.sh`` (the inverse of ``render_sh``), read as bash
    reads it: a quoted value may hold a newline, and a line ends in ``\\`` only outside quotes."""
    try:
        words = shlex.split(_join_lines(text))
    except ValueError as exc:  # an unclosed quote: not what render_sh writes
        raise ExportError(f"not a launch file written by tuner export: {exc}") from exc
    start = next((i for i, w in enumerate(words) if w == "exec"), None)
    if start is None:
        raise ExportError("no 'exec' line: not a launch file written by tuner export")
    command = words[start + 1 :]
    if len(command) < 3 or command[1] != "-m":
        raise ExportError("the exec line does not start an engine module")
    _, args = engine_args(command)
    return command[2], args


def _join_lines(text: str) -> str:
    """``text`` as bash reads it before splitting words: comments dropped, and every backslash-newline
    outside single quotes removed (``shlex.quote`` writes a quote as ``'"'"'``: double quotes count too)."""
    out, quote, i = [], "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            if text.startswith("\n", i + 1):
                i += 2
                continue
            out.append(text[i : i + 2])  # an escaped character, never a quote
            i += 2
            continue
        if char == "#" and not quote and (i == 0 or text[i - 1].isspace()):
            end = text.find("\n", i)  # a comment: its quotes are no quotes (provenance holds user text)
            i = len(text) if end < 0 else end
            continue
        if char in "'\"" and quote in ("", char):
            quote = char if quote == "" else ""
        out.append(char)
        i += 1
    return "".join(out)


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
    ``formats`` (sh, compose, k8s, python, json), by default ``sh`` and ``json``, plus ``python`` for
    SGLang, whose users launch from Python as often as from a shell."""
    from tuner.check import check_argvs
    from tuner.engines import ADAPTERS
    from tuner.engines.env import probe

    manifests = [manifest(study, t) for t in select_trials(study, numbers)]
    for engine in sorted({m["engine"] for m in manifests}):
        mine = [m for m in manifests if m["engine"] == engine]
        env = probe(ADAPTERS[engine](), Path((engine_envs or {}).get(engine) or mine[0]["python"]))
        for m, verdict in zip(mine, check_argvs(env, [m["argv"] for m in mine]), strict=True):
            if not verdict["ok"]:
                raise ExportError(f"trial {m['trial']}: {engine} {env.version} rejects the command: {verdict['error']}")
            m["parser_check"] = {"engine_version": env.version, **verdict}
    files: list[tuple[Path, str]] = []
    for m in manifests:  # render every file first: a failure must leave no half-written export
        stem = out_dir / safe_stem(m["study"], m["trial"])
        chosen = formats or ["sh", "json", *(["python"] if m["engine"] == "sglang" else [])]
        for fmt in dict.fromkeys(chosen):
            suffix, render = RENDERERS[fmt]
            files.append((stem.with_name(stem.name + suffix), render(m)))
    return write_all(out_dir, files)
