"""Search spaces: YAML validated by pydantic (unknown keys rejected), sampled into a ``Config``.

Each engine has its own sub-space: an engine's parameters are named ``<engine>.<param>`` in the
study, so Optuna never treats one engine's parameter as another's. A parameter left out of the
YAML is not tuned, and the engine's default applies. See ``tuner/search/default_space.yaml``.

Speculative decoding is sampled as it is run: first the method (``<engine>.spec_method``, among
those the engine can run here: ``tuner.search.speculation``), then only what that method takes: K
(``<engine>.num_speculative_tokens``), its draft or head (``<engine>.<method>.draft``, among those
that serve it) and the engine parameters the adapter lists for it (``ngram_lookup``,
``spec_schedule``, ``spec_tree``). No invalid pair is ever sampled, so none is rejected after.
A space written before methods were a parameter (K from 0, ``draft_model`` naming drafts or a
model-free method) still reads: K = 0 is off, a method named as a draft is that method, the other
drafts are draft models.

Whether a search space can go on in a study that already holds trials.

Optuna stores every parameter's distribution with the trial, and its storage refuses a parameter
whose kind changes, or a categorical one whose choices change, within one study (a ValueError from
deep inside ``suggest_*``, mid-trial). A range may be narrowed or widened freely. So a resumed
search with another space is checked before any trial starts, and a change Optuna would refuse is
one ConfigError naming the parameter.

Configs to boot first (``enqueue:``): each entry names an engine and the value of every parameter
the sampler would draw for it, so it boots exactly as written. It is checked here against the space
(a parameter the space tunes, a value among its choices or in its range, a method's parameters only
with that method) and becomes a study's trials in ``tuner.search.enqueue``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

from tuner.engines import ADAPTERS, DEFAULT_ENGINES
from tuner.engines.base import Config
from tuner.engines.speculation import DRAFT_MODEL, ENGINE_PARAMS, LABELS, METHODS, OFF, WITH_DRAFT
from tuner.errors import ConfigError
from tuner.inputs import parse_bounded, read_text
from tuner.search.speculation import Offer

DEFAULT_SPACE = Path(__file__).resolve().parent / "default_space.yaml"  # package data: found after any install


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


class MethodChoices(_Strict):
    """Speculative methods to choose among (``tuner.engines.speculation``), ``off`` among them."""

    choices: list[StrictStr] = Field(min_length=1)

    @field_validator("choices", mode="before")
    @classmethod
    def _off(cls, choices: object) -> object:
        # YAML 1.1 reads a bare `off` as false: in this list it can only mean the method
        return [OFF if c is False else c for c in choices] if isinstance(choices, list) else choices

    @field_validator("choices")
    @classmethod
    def _known(cls, choices: list[str]) -> list[str]:
        unknown = [c for c in choices if c not in (OFF, *METHODS)]
        if unknown:
            raise ValueError(f"unknown method {unknown[0]!r}; known: {', '.join((OFF, *METHODS))}")
        return list(dict.fromkeys(choices))


Pair = tuple[StrictInt, StrictInt]


class LookupChoices(_Strict):
    """n-gram lookup windows, ``[min, max]`` tokens matched in the prompt, as choices."""

    choices: list[Pair] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _windows(cls, choices: list[Pair]) -> list[Pair]:
        if any(not 1 <= low <= high for low, high in choices):
            raise ValueError("each window is [min, max] with 1 <= min <= max")
        return choices


class TreeChoices(_Strict):
    """Draft trees, ``[top-k, draft tokens]``, as choices: top-k 1 is a chain of K + 1 tokens."""

    choices: list[Pair] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _trees(cls, choices: list[Pair]) -> list[Pair]:
        if any(topk < 1 or tokens < 2 for topk, tokens in choices):
            raise ValueError("each tree is [top-k, draft tokens] with top-k >= 1 and at least 2 draft tokens")
        return choices


def pair_label(pair: Sequence[int], sep: str) -> str:
    """A pair as one categorical choice (Optuna's choices are plain values): ``2-4``, ``4x8``."""
    return f"{int(pair[0])}{sep}{int(pair[1])}"


def pair_of(label: str, sep: str) -> list[int]:
    first, _, second = label.partition(sep)
    return [int(first), int(second)]


PAIR_SEP = {"ngram_lookup": "-", "spec_tree": "x"}


class Parameters(_Strict):
    chunk_size: PositiveChoices | None = None
    max_num_seqs: PositiveChoices | None = None
    memory_fraction: FractionRange | FractionChoices | None = None
    spec_method: MethodChoices | None = None  # left out: K from 0 (off) with draft models, as spaces were
    num_speculative_tokens: IntRange | CountChoices | None = None  # K, of every method
    draft_model: Choices | None = None  # names of drafts and heads; left out: every one the model has
    tensor_parallel: PositiveChoices | None = None  # GPUs per engine, at most --gpus-per-trial
    ngram_lookup: LookupChoices | None = None  # for engines whose n-gram lookup takes a window
    spec_schedule: ScheduleChoices | None = None  # for engines that take K by batch size
    spec_tree: TreeChoices | None = None  # for engines whose EAGLE family takes a draft tree

    @model_validator(mode="after")
    def _speculation(self) -> Parameters:
        if self.spec_method is None:
            return self
        ks = self.num_speculative_tokens
        if ks is None and any(m != OFF for m in self.spec_method.choices):
            raise ValueError("spec_method lists methods: give num_speculative_tokens (K) too")
        if ks is not None and 0 in k_values(ks, every=False):
            raise ValueError("num_speculative_tokens counts from 1 with spec_method: off is a method of its own")
        return self

    def methods(self) -> tuple[str, ...]:
        """The methods this space lists: its ``spec_method``, or those of a space written before it."""
        if self.spec_method is not None:
            return tuple(self.spec_method.choices)
        if self.num_speculative_tokens is None:
            return ()
        off = (OFF,) if 0 in k_values(self.num_speculative_tokens, every=False) else ()
        named = list(map(str, self.draft_model.choices)) if self.draft_model is not None else []
        free = [d for d in named if d in METHODS]
        drafts = (DRAFT_MODEL,) if self.draft_model is None or len(free) < len(named) else ()
        return tuple(dict.fromkeys((*off, *drafts, *free)))

    def named_drafts(self) -> list[str] | None:
        """The drafts and heads the space names (None: every one the model has)."""
        return None if self.draft_model is None else [str(d) for d in self.draft_model.choices if d not in METHODS]


def k_tuned(ks: IntRange | CountChoices | None) -> bool:
    """Whether the space tunes K at all: some K of at least one (K = 0 alone is speculation off)."""
    return ks is not None and max(k_values(ks, every=False)) >= 1


def k_values(ks: IntRange | CountChoices, every: bool = True) -> list[int]:
    """K's values (``every``: each integer of a range; else only its ends, enough to see a 0)."""
    if isinstance(ks, CountChoices):
        return list(dict.fromkeys(ks.choices))
    return list(range(ks.low, ks.high + 1)) if every else [ks.low, ks.high]


class Static(_Strict):
    max_model_len: int = Field(default=2048, gt=0)
    enforce_eager: bool = True  # the CPU build's boot without compiling is far shorter, and boots dominate its studies
    cpu_memory_budget_mib: int = Field(default=32, gt=0)
    # "dummy": random weights from config.json alone, for shapes whose weights cannot be had here
    load_format: str | None = None


class Enqueued(_Strict):
    """One config to boot right after the engine defaults: written flat in YAML, ``engine`` beside
    the parameters (``{engine: vllm, chunk_size: 2048, spec_method: off}``)."""

    engine: StrictStr
    params: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, raw: object) -> object:
        if not isinstance(raw, dict) or "engine" not in raw:
            raise ValueError("each entry is a mapping that names its engine and its parameters' values")
        params = {k: v for k, v in raw.items() if k != "engine"}
        if params.get("spec_method") is False:  # YAML 1.1 reads a bare `off` as false
            params["spec_method"] = OFF
        return {"engine": raw["engine"], "params": params}


TUNED = ("chunk_size", "max_num_seqs", "tensor_parallel", "memory_fraction")  # what every config may set
PARAMETERS = tuple(Parameters.model_fields)


class Space(_Strict):
    engines: list[str] = Field(default_factory=lambda: list(DEFAULT_ENGINES), min_length=1)
    engine_envs: dict[str, str] = Field(default_factory=dict)
    parameters: Parameters = Field(default_factory=Parameters)
    static: Static = Field(default_factory=Static)
    enqueue: list[Enqueued] = Field(default_factory=list)  # booted after the engine defaults, in this order

    @field_validator("engines", "engine_envs")
    @classmethod
    def _known_engines(cls, engines: list[str] | dict[str, str]) -> list[str] | dict[str, str]:
        unknown = [e for e in engines if e not in ADAPTERS]
        if unknown:
            raise ValueError(f"unknown engine {unknown[0]!r}; known: {', '.join(ADAPTERS)}")
        return engines

    @model_validator(mode="after")
    def _enqueue_fits(self) -> Space:
        for i, entry in enumerate(self.enqueue):
            wrong = enqueue_problem(entry, self.engines, self.parameters)
            if wrong is None:
                wrong = next(
                    (f"the same config as enqueue.{j}" for j, e in enumerate(self.enqueue[:i]) if e == entry), None
                )
            if wrong is not None:
                raise ValueError(f"enqueue.{i} ({entry.engine}): {wrong}")
        return self


def drawn(engine: str, method: str | None, p: Parameters) -> list[str]:
    """The parameters the sampler draws for a config of ``engine`` speculating with ``method``."""
    names = [k for k in TUNED if getattr(p, k) is not None]
    ks = p.num_speculative_tokens
    if not any(m != OFF for m in p.methods()) or not k_tuned(ks):
        return names  # speculation is not tuned: no method is drawn (speculation_distributions)
    names.append("spec_method")
    if method is None or method == OFF:
        return names
    names.append("num_speculative_tokens")
    if method in WITH_DRAFT:
        names.append("draft_model")
    support = ADAPTERS[engine].spec_methods.get(method)
    return names + [q for q in (support.params if support else ()) if getattr(p, q) is not None]


def enqueue_problem(entry: Enqueued, engines: Sequence[str], p: Parameters) -> str | None:
    """What is wrong with an enqueue entry against the space, in a few words (None: nothing)."""
    if entry.engine not in engines:
        return f"engine {entry.engine!r} is not among the space's engines ({', '.join(engines)})"
    for name in entry.params:
        if name not in PARAMETERS:
            return f"unknown parameter {name!r}; parameters: {', '.join(PARAMETERS)}"
    method = entry.params.get("spec_method")
    if method is not None and p.methods() and method not in p.methods():  # before what the method would take
        return _outside("spec_method", method, p)
    if method is not None and method != OFF and method not in ADAPTERS[entry.engine].spec_methods:
        return f"{entry.engine} has no {LABELS.get(str(method), method)}"
    needed = drawn(entry.engine, None if method is None else str(method), p)
    for name in entry.params:
        if name in needed:
            continue
        if name in TUNED or "spec_method" not in needed or (name in ENGINE_PARAMS and getattr(p, name) is None):
            return f"{name} is not tuned by this space: leave it out"
        return f"{name} is not used by spec_method {method} on {entry.engine}: leave it out"
    missing = [name for name in needed if name not in entry.params]
    if missing:
        return f"give {missing[0]}: the sampler draws it for this config"
    return next((w for name, v in entry.params.items() if (w := _outside(name, v, p)) is not None), None)


def _outside(name: str, value: Any, p: Parameters) -> str | None:
    """Why ``value`` is not one the space's ``name`` can take (None: it is)."""
    if name == "spec_method":
        ok, among = value in p.methods(), f"methods [{', '.join(p.methods())}]"
    elif name == "draft_model":  # a name the space does not list is checked against the model at start
        named = p.named_drafts()
        ok, among = isinstance(value, str) and (named is None or value in named), f"drafts [{', '.join(named or [])}]"
    else:
        given = getattr(p, name)
        ok, among = _contains(given, value), _choices_text(given)
    return None if ok else f"{name} {value!r} is outside the space's {among}"


def _contains(given: BaseModel, value: Any) -> bool:
    if isinstance(given, FractionRange):
        if isinstance(value, bool) or not isinstance(value, int | float) or not given.low <= value <= given.high:
            return False
        steps = 0.0 if given.step is None else (value - given.low) / given.step
        return abs(steps - round(steps)) < 1e-8  # Optuna's own test of a point on a step grid
    if isinstance(given, IntRange):
        return type(value) is int and max(given.low, 1) <= value <= given.high  # K = 0 is spec_method off
    if isinstance(given, ScheduleChoices):
        return isinstance(value, str) and value in given.choices
    if isinstance(given, LookupChoices | TreeChoices):
        return isinstance(value, list) and tuple(value) in [tuple(c) for c in given.choices]
    choices = getattr(given, "choices", [])
    positive = not isinstance(given, CountChoices) or (isinstance(value, int) and value > 0)
    return positive and not isinstance(value, bool) and value in choices and type(value) in {type(c) for c in choices}


def _choices_text(given: BaseModel) -> str:
    if isinstance(given, FractionRange | IntRange):
        step = f" step {given.step}" if isinstance(given, FractionRange) and given.step else ""
        return f"range {given.low}..{given.high}{step}"
    choices = getattr(given, "choices", [])
    return f"choices [{', '.join(str(list(c) if isinstance(c, tuple) else c) for c in choices)}]"


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
        loc = ".".join(str(p) for p in first["loc"])
        key = f"{loc}: " if loc else ""  # a check across keys (an enqueue entry's) names the key in its message
        raise ConfigError(f"{where}: {key}{first['msg'].removeprefix('Value error, ')}") from exc


def distributions(space: Space, offers: Mapping[str, Offer]) -> dict[str, BaseDistribution]:
    """Every distribution ``suggest`` can ask for, by Optuna parameter name: ``engine``, then each
    engine's own (``vllm.chunk_size``, ...), speculation's only where the engine's offer has a method."""
    out: dict[str, BaseDistribution] = {"engine": CategoricalDistribution(list(offers))}
    p = space.parameters
    for engine, offer in offers.items():
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
        out.update({name(k): d for k, d in speculation_distributions(p, offer).items()})
    return out


def speculation_distributions(p: Parameters, offer: Offer) -> dict[str, BaseDistribution]:
    """One engine's speculation parameters (unprefixed): none unless some method would speculate."""
    ks = p.num_speculative_tokens
    if not offer.speculates or ks is None or not k_tuned(ks):
        return {}  # nothing to speculate with: not tuned, so no trial claims a K it never ran
    k: BaseDistribution = (
        CategoricalDistribution([c for c in ks.choices if c > 0])
        if isinstance(ks, CountChoices)
        else IntDistribution(max(ks.low, 1), ks.high)
    )
    out: dict[str, BaseDistribution] = {
        "spec_method": CategoricalDistribution(list(offer.methods)),
        "num_speculative_tokens": k,
    }
    for method, drafts in offer.drafts.items():
        out[f"{method}.draft"] = CategoricalDistribution(list(drafts))
    taken = {param for params in offer.params.values() for param in params}
    for param in ENGINE_PARAMS:
        given = getattr(p, param)
        if param in taken and given is not None:
            out[param] = CategoricalDistribution(labels(param, given))
    return out


def labels(param: str, given: ScheduleChoices | LookupChoices | TreeChoices) -> list[str]:
    """An engine parameter's choices as Optuna's categorical choices: a schedule's name, a pair's label."""
    if isinstance(given, ScheduleChoices):
        return list(given.choices)
    return [pair_label(c, PAIR_SEP[param]) for c in given.choices]


def suggest(trial: optuna.Trial, space: Space, offers: Mapping[str, Offer], is_default: bool) -> Config:
    """Sample one config over the engines that run here; the enqueued default trial samples only its engine."""
    engine = str(trial.suggest_categorical("engine", list(offers)))
    eager = space.static.enforce_eager
    if is_default:
        return Config(engine=engine, params={}, enforce_eager=eager, is_default=True)
    dists, params = distributions(space, {engine: offers[engine]}), {}
    name = f"{engine}.{{}}".format
    for key in TUNED:
        if name(key) in dists:
            params[key] = _draw(trial, name(key), dists[name(key)])
    if isinstance(dists.get(name("memory_fraction")), FloatDistribution):
        params["memory_fraction"] = round(params["memory_fraction"], 6)  # 0.30000000000000004 from the step grid
    params.update(_speculation(trial, space.parameters, offers[engine], engine, dists))
    return Config(engine=engine, params=params, enforce_eager=eager)


def _speculation(
    trial: optuna.Trial, p: Parameters, offer: Offer, engine: str, dists: Mapping[str, BaseDistribution]
) -> dict[str, Any]:
    """The method first, then only what it takes (see the module docstring)."""
    name = f"{engine}.{{}}".format
    if name("spec_method") not in dists:
        return {}
    method = str(_draw(trial, name("spec_method"), dists[name("spec_method")]))
    if method == OFF:
        return {"spec_method": OFF}
    params: dict[str, Any] = {
        "spec_method": method,
        "num_speculative_tokens": int(
            _draw(trial, name("num_speculative_tokens"), dists[name("num_speculative_tokens")])
        ),
    }
    if method in WITH_DRAFT:
        params["draft_model"] = str(_draw(trial, name(f"{method}.draft"), dists[name(f"{method}.draft")]))
    for param in offer.params.get(method, ()):
        if name(param) not in dists:
            continue
        chosen = str(_draw(trial, name(param), dists[name(param)]))
        if param == "spec_schedule":
            ranges = p.spec_schedule.choices[chosen] if p.spec_schedule is not None else None
            if ranges is not None:  # a fixed K is no parameter at all: the engine's own behaviour
                params[param] = [list(r) for r in ranges]
        else:
            params[param] = pair_of(chosen, PAIR_SEP[param])
    return params


def _draw(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high)
    assert isinstance(dist, FloatDistribution)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step)


# A space that a study's earlier trials fix: Optuna rejects a distribution changed under a name.
def check_space_fits(study: optuna.Study, space: Space, offers: Mapping[str, Offer]) -> None:
    """Refuse, in one line, a space whose parameters Optuna would reject in this study's trials."""
    planned = distributions(space, offers)
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
