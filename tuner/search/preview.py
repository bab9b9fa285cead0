"""``tuner workload``: build a workload exactly as a trial of ``tuner search`` would, and show it.

The model and context are resolved as the search resolves them (``--model``, else the generated
default models, made once with an engine environment's Python; the context from the search space),
so the requests written, and their digest, are the ones a study with the same flags would send.
"""

from __future__ import annotations

from pathlib import Path

from tuner.engines import ADAPTERS, models
from tuner.engines.base import ModelSpec
from tuner.engines.env import probe
from tuner.errors import ConfigError, EnvironmentSetupError
from tuner.search.run import SearchOptions, resolve_workload
from tuner.search.space import Space, load_space
from tuner.workloads import load_tokenizer, source
from tuner.workloads.inspection import check_writable, summary_lines, write_jsonl


def preview(opts: SearchOptions, out: Path) -> list[str]:
    """Write the requests to ``out`` (JSONL) and return the lines that describe them."""
    if out.suffix != ".jsonl":
        raise ConfigError(f"--out {out}: expected a .jsonl file")
    check_writable(out)  # before the workload is built: a bad path is one line, at once
    given = source(opts.workload)  # a bad name or trace fails before a model is looked for
    space = load_space(opts.space)
    model = _model(opts, space)
    workload = resolve_workload(opts, model, given)
    write_jsonl(workload, out)
    lines = summary_lines(workload, load_tokenizer(Path(model.path)))
    return [*lines, f"  written to {out}"]


def _model(opts: SearchOptions, space: Space) -> ModelSpec:
    max_len = space.static.max_model_len
    if opts.model is not None:
        return models.user_models(opts.model, [], max_len)
    spec = models.default_model_paths(max_len)
    if (Path(spec.path).parent / "DONE").exists():
        return spec  # already generated: no engine environment needed
    failures = []
    for name in space.engines:
        where = opts.engine_envs.get(name) or space.engine_envs.get(name)
        try:
            env = probe(ADAPTERS[name](), Path(where) if where else None)
        except EnvironmentSetupError as exc:
            failures.append(str(exc))
            continue
        return models.default_models(env.python, max_len)
    raise EnvironmentSetupError(f"generating the default models needs an engine environment: {'; '.join(failures)}")
