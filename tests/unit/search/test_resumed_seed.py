"""A resumed study, or a fleet worker, does not replay the draws its sampler made before (``resumed_seed``):
on a real SQLite study through ``open_for``, against Optuna's own behaviour with the seed reused."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.search.options import SearchOptions
from tuner.search.run import open_for
from tuner.search.samplers import make_sampler, resumed_seed

Draw = tuple[int, float]


def _draws(study: optuna.Study, n: int) -> list[Draw]:
    out = []
    for _ in range(n):
        trial = study.ask()
        draw = (trial.suggest_categorical("chunk_size", [512, 1024, 2048, 4096, 8192]),
                trial.suggest_float("memory_fraction", 0.5, 0.95))  # fmt: skip
        study.tell(trial, float(draw[0]) * draw[1])
        out.append(draw)
    return out


@pytest.mark.parametrize("sampler", ["tpe", "random", "model"])
def test_a_resumed_study_draws_new_configs_where_the_same_seed_replays_its_first(tmp_path: Path, sampler: str) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    opts = SearchOptions(workload="rag", objective="goodput" if sampler != "model" else "capacity", sampler=sampler)
    first = _draws(open_for(opts, "s", url), 3)
    # what Optuna does with the seed reused: the same draws again (why resumed_seed exists)
    replayed = optuna.load_study(study_name="s", storage=url, sampler=make_sampler(sampler, opts.seed))
    if sampler != "model":  # the model sampler needs its study's context to sample at all
        assert _draws(replayed, 3) == first
    resumed = _draws(open_for(opts, "s", url), 3)
    assert not set(resumed) & set(first), (first, resumed)


def test_two_workers_joining_a_fresh_study_draw_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    opts = SearchOptions(workload="rag", objective="goodput", sampler="random", worker=True)
    draws = []
    for pid in (101, 202):
        monkeypatch.setattr("tuner.search.run.os.getpid", lambda pid=pid: pid)
        study = open_for(opts, f"w{pid}", url)  # a fresh study each: both see no trial
        draws.append(_draws(study, 3))
    assert not set(draws[0]) & set(draws[1]), draws


def test_the_seed_is_kept_on_a_fresh_study_and_derived_alike_on_a_resumed_one() -> None:
    assert resumed_seed(7, 0) == 7 and resumed_seed(None, 5) is None
    assert resumed_seed(7, 5) == resumed_seed(7, 5) != 7  # a resumed study is still reproducible
    assert len({resumed_seed(7, 5), resumed_seed(7, 6), resumed_seed(8, 5), resumed_seed(7, 0, "h/1")}) == 4
    assert all(0 <= s < 2**32 for s in (resumed_seed(7, 5), resumed_seed(0, 0, "h/2")) if s is not None)
