"""Search spaces: YAML validated by pydantic (unknown keys rejected), sampled into a ``Config``.

Each engine has its own sub-space: an engine's parameters are named ``<engine>.<param>`` in the
study, so Optuna never treats one engine's parameter as another's. A parameter left out of the
YAML is not tuned, and the engine's default applies. See ``tuner/search/default_space.yaml``.

Whether a search space can go on in a study that already holds trials.

Optuna stores every parameter's distribution with the trial, and its storage refuses a parameter
whose kind changes, or a categorical one whose choices change, within one study (a ValueError from
deep inside ``suggest_*``, mid-trial). A range may be narrowed or widened freely. So a resumed
search with another space is checked before any trial starts, and a change Optuna would refuse is
one ConfigError naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    check_distribution_compatibility,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from tuner.engines import ADAPTERS
from tuner.engines.base import Config
from tuner.errors import ConfigError
from tuner.inputs import parse_bounded, read_text

DEFAULT_SPACE = Path(__file__).resolve().parent / "default_space.yaml"  # package data: found after any install
KNOWN_ENGINES = ("vllm", "sglang")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # an infinite step is no grid


class Choices(_Strict):
    # Strict types: YAML's `true` must not slip in as the integer 1.
    choices: list[StrictInt | StrictFloat | StrictStr] = Field(min_length=1)


class IntRange(_Strict):
    low: int = Field(ge=0)
    high: int

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


class FractionRange(_Strict):
    low: float = Field(gt=0.0, le=1.0)
    high: float = Field(gt=0.0, le=1.0)
    step: float | None = Field(default=None, gt=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> FractionRange:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


class FractionChoices(_Strict):
    choices: list[StrictFloat] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _fractions(cls, choices: list[float]) -> list[float]:
        if any(not 0.0 < c <= 1.0 for c in choices):
            raise ValueError("choices must be fractions in (0, 1]")
        return choices


class CountChoices(_Strict):
    choices: list[StrictInt] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _non_negative(cls, choices: list[int]) -> list[int]:
        if any(c < 0 for c in choices):
            raise ValueError("choices must be integers of at least 0")
        return choices


class PositiveChoices(_Strict):
    choices: list[StrictInt] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _positive(cls, choices: list[int]) -> list[int]:
        if any(c <= 0 for c in choices):
            raise ValueError("choices must be positive integers")
        return choices


Range = tuple[StrictInt, StrictInt, StrictInt]  # first batch size, last batch size (inclusive), K


class ScheduleChoices(_Strict):
    """vLLM's speculative K by batch size (``num_speculative_tokens_per_batch_size``), as named choices.

    Each schedule is a list of ``[first, last, K]`` ranges, or null for a fixed K. The tuner never
    infers a schedule: it measures the ones listed. The rules are vLLM's own, checked here so a bad
    schedule is refused before anything boots: ranges start at batch size 1, each range's first is
    not above its last, K is at least 0, and no two ranges overlap. vLLM caps each K at the trial's
    ``num_speculative_tokens``.
    """

    choices: dict[str, list[Range] | None] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _valid(cls, choices: dict[str, list[Range] | None]) -> dict[str, list[Range] | None]:
        for name, ranges in choices.items():
            if ranges is None:
                continue
            if not ranges:
                raise ValueError(f"schedule {name!r} is empty: give ranges, or null for a fixed K")
            ordered = sorted(ranges)
            if ordered[0][0] != 1:
                raise ValueError(f"schedule {name!r} must start at batch size 1, so every batch has a K")
            for first, last, k in ordered:
                if first < 1 or last < first or k < 0:
                    raise ValueError(f"schedule {name!r}: range {[first, last, k]} needs 1 <= first <= last and K >= 0")
            for (_, last, _), (first, _, _) in zip(ordered, ordered[1:], strict=False):
                if first <= last:
                    raise ValueError(f"schedule {name!r}: ranges overlap at batch size {first}")
        return choices


class Parameters(_Strict):
    chunk_size: PositiveChoices | None = None
    max_num_seqs: PositiveChoices | None = None
    memory_fraction: FractionRange | FractionChoices | None = None
    num_speculative_tokens: IntRange | CountChoices | None = None
    draft_model: Choices | None = None  # names; left out: every draft the model spec offers
    tensor_parallel: PositiveChoices | None = None  # GPUs per engine, at most --gpus-per-trial
    spec_schedule: ScheduleChoices | None = None  # vLLM only: K by batch size, when speculating


class Static(_Strict):
    max_model_len: int = Field(default=2048, gt=0)
    enforce_eager: bool = True  # the CPU build's boot without compiling is far shorter, and boots dominate its studies
    cpu_memory_budget_mib: int = Field(default=32, gt=0)
    # "dummy": random weights from config.json alone, for shapes whose weights cannot be had here
    load_format: str | None = None


class Space(_Strict):
    engines: list[str] = Field(default_factory=lambda: ["vllm"], min_length=1)
    engine_envs: dict[str, str] = Field(default_factory=dict)
    parameters: Parameters = Field(default_factory=Parameters)
    static: Static = Field(default_factory=Static)

    @field_validator("engines", "engine_envs")
    @classmethod
    def _known_engines(cls, engines: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        unknown = [e for e in engines if e not in KNOWN_ENGINES]
        if unknown:
            raise ValueError(f"unknown engine {unknown[0]!r}; known: {', '.join(KNOWN_ENGINES)}")
        return engines


def load_space(path: Path | None = None) -> Space:
    """Read and validate a search-space file; every problem is a ConfigError naming the key."""
    where = path or DEFAULT_SPACE
    text = read_text(where, "a search space", "YAML")
    try:
        raw = parse_bounded(yaml.safe_load, text, str(where))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a search space must be a mapping of keys")
    try:
        return Space.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{where}: {key}: {first['msg']}") from exc


def distributions(space: Space, engines: Sequence[str], drafts: Sequence[str]) -> dict[str, BaseDistribution]:
    """Every distribution ``suggest`` can ask for, by Optuna parameter name: ``engine``, then each
    engine's own (``vllm.chunk_size``, ...). A draft model only where there is one to speculate with."""
    out: dict[str, BaseDistribution] = {"engine": CategoricalDistribution(list(engines))}
    p = space.parameters
    draft_choices = list(p.draft_model.choices) if p.draft_model is not None else list(drafts)
    for engine in engines:
        name = f"{engine}.{{}}".format
        for key in ("chunk_size", "max_num_seqs", "tensor_parallel"):
            choices: Choices | None = getattr(p, key)
            if choices is not None:
                out[name(key)] = CategoricalDistribution(choices.choices)
        if isinstance(p.memory_fraction, FractionChoices):
            out[name("memory_fraction")] = CategoricalDistribution(p.memory_fraction.choices)
        elif p.memory_fraction is not None:
            r = p.memory_fraction
            out[name("memory_fraction")] = FloatDistribution(r.low, r.high, step=r.step)
        ks = p.num_speculative_tokens
        if ks is None or not draft_choices:
            continue  # nothing to speculate with: not tuned, so no trial claims a K it never ran
        out[name("num_speculative_tokens")] = (
            CategoricalDistribution(ks.choices) if isinstance(ks, CountChoices) else IntDistribution(ks.low, ks.high)
        )
        _check_drafts(engine, [str(d) for d in draft_choices], drafts)
        out[name("draft_model")] = CategoricalDistribution(draft_choices)
        if engine == "vllm" and p.spec_schedule is not None:
            out[name("spec_schedule")] = CategoricalDistribution(list(p.spec_schedule.choices))
    return out


def _check_drafts(engine: str, named: Sequence[str], drafts: Sequence[str]) -> None:
    """A draft the space names must be one the model has (``--draft-model``), one the engine runs
    without a model, or a model folder; else a launch would carry the bare name as the draft's path."""
    free = ADAPTERS[engine].model_free_drafts
    for draft in named:
        if draft not in drafts and draft not in free and not (Path(draft) / "config.json").is_file():
            known = ", ".join([*drafts, *free]) or "none: give one with --draft-model"
            raise ConfigError(f"parameters.draft_model: no draft {draft!r} for {engine} here; drafts: {known}")


def suggest(
    trial: optuna.Trial, space: Space, engines: Sequence[str], drafts: Sequence[str], is_default: bool
) -> Config:
    """Sample one config over the engines that run here; the enqueued default trial samples only its engine."""
    engine = str(trial.suggest_categorical("engine", list(engines)))
    eager = space.static.enforce_eager
    if is_default:
        return Config(engine=engine, params={}, enforce_eager=eager, is_default=True)
    dists, params = distributions(space, [engine], drafts), {}
    name = f"{engine}.{{}}".format
    for key in ("chunk_size", "max_num_seqs", "tensor_parallel", "memory_fraction", "num_speculative_tokens"):
        if name(key) in dists:
            params[key] = _draw(trial, name(key), dists[name(key)])
    if isinstance(dists.get(name("memory_fraction")), FloatDistribution):
        params["memory_fraction"] = round(params["memory_fraction"], 6)  # 0.30000000000000004 from the step grid
    if params.get("num_speculative_tokens"):
        params["num_speculative_tokens"] = int(params["num_speculative_tokens"])
        params["draft_model"] = _draw(trial, name("draft_model"), dists[name("draft_model")])
        if name("spec_schedule") in dists and space.parameters.spec_schedule is not None:
            chosen = str(_draw(trial, name("spec_schedule"), dists[name("spec_schedule")]))
            ranges = space.parameters.spec_schedule.choices[chosen]
            if ranges is not None:  # a fixed K is no parameter at all: the engine's own behaviour
                params["spec_schedule"] = [list(r) for r in ranges]
    return Config(engine=engine, params=params, enforce_eager=eager)


def _draw(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high)
    assert isinstance(dist, FloatDistribution)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step)


# A space that a study's earlier trials fix: Optuna rejects a distribution changed under a name.
def check_space_fits(study: optuna.Study, space: Space, engines: Sequence[str], drafts: Sequence[str]) -> None:
    """Refuse, in one line, a space whose parameters Optuna would reject in this study's trials."""
    planned = distributions(space, engines, drafts)
    seen: set[str] = set()
    for trial in study.get_trials(deepcopy=False):
        for param, old in trial.distributions.items():
            new = planned.get(param)
            if new is None or param in seen:
                continue
            seen.add(param)
            try:
                check_distribution_compatibility(old, new)
            except ValueError:
                raise ConfigError(
                    f"study {study.study_name!r} searched {param} over {_describe(old)}; this space makes it "
                    f"{_describe(new)}, which Optuna cannot mix in one study: keep its choices (a range may "
                    "change) or use another --study"
                ) from None


def _describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return "choices [" + ", ".join(str(c) for c in dist.choices) + "]"
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        return f"the range {dist.low}..{dist.high}"
    return type(dist).__name__
