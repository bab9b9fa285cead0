"""Synthetic studies for the report tests: a capacity study and a Pareto study, stored in SQLite.

The trials carry the attributes a search records (``launch``, ``capacity``, the flat capacities,
``config_kind``), with the float noise a sampler leaves (``0.30000000000000004``), an older trial that
has only its ``argv``, a failed trial with no ``capacity`` and one with a malformed one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

ENGINES = {
    "vllm": {"version": "0.32.0", "distribution": "vllm"},
    "sglang": {"version": "0.5.23", "distribution": "sglang"},
}
TIERS = {
    "interactive": {"ttft_p95_ms": 200.0, "tpot_p95_ms": 6.0},
    "relaxed": {"ttft_p95_ms": 1000.0, "tpot_p95_ms": 20.0},
}
NOISY = 0.30000000000000004
VLLM = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = {
    "engine": CategoricalDistribution(["vllm", "sglang"]),
    "vllm.memory_fraction": FloatDistribution(0.1, 0.95),
    "vllm.max_num_seqs": IntDistribution(8, 512, log=True),
    "sglang.mem_fraction_static": FloatDistribution(0.1, 0.95),
}


def launch(module: str, port: int, *args: str) -> dict[str, Any]:
    return {
        "python": "/opt/engine/bin/python",
        "module": module,
        "args": ["--model", "/models/m", *args],
        "host": "127.0.0.1",
        "port": port,
        "env": {},
    }


def step(rate: float, capacity: float, slo: dict[str, float]) -> dict[str, Any]:
    """A step of a curve that holds its SLO up to ``capacity`` and degrades past it."""
    load = rate / capacity
    attainment = 1.0 if load <= 1.0 else max(0.0, 1.0 - (load - 1.0))
    ttft, tpot = slo["ttft_p95_ms"] * 0.6 * load**2, slo["tpot_p95_ms"] * 0.7 * load
    return {
        "rate_req_s": rate,
        "attainment": attainment,
        "passed": attainment >= 0.9,
        "saturated": load > 1.5,
        "collapsed": False,
        "n_requests": 40,
        "n_counted": 32,
        "n_errors": 0,
        "duration_s": 20.1,
        "ttft_p50_ms": ttft / 2,
        "ttft_p95_ms": ttft,
        "tpot_p50_ms": tpot / 2,
        "tpot_p95_ms": tpot,
        "itl_p50_ms": tpot / 2,
        "itl_p95_ms": tpot,
        "e2e_p50_ms": 500.0,
        "e2e_p95_ms": 700.0,
        "request_throughput_req_s": min(rate, capacity),
        "output_throughput_tok_s": 120.0 * min(rate, capacity),
        "server": {},
    }


def capacity_attrs(interactive: float, relaxed: float) -> dict[str, Any]:
    found = {"interactive": interactive, "relaxed": relaxed}
    tiers = {}
    for name, slo in TIERS.items():
        rates = [found[name] * f for f in (0.5, 2.0, 1.0, 1.5)]  # measured out of order, as a bisection does
        tiers[name] = {
            "slo": slo,
            "target": 0.9,
            "resolution": 0.1,
            "capacity_req_s": found[name],
            "stop_reason": "resolved",
            "pruned": False,
            "steps": [step(r, found[name], slo) for r in rates],
        }
    return {
        "capacity": {"objective_tier": "interactive", "tiers": tiers, "search_s": 55.2, "steps_measured": 8},
        "capacity_req_s": interactive,
        "capacity_interactive_req_s": interactive,
        "capacity_relaxed_req_s": relaxed,
    }


def add(study: optuna.Study, params: dict[str, Any], attrs: dict[str, Any], value: float) -> None:
    kind = "engine_default" if len(params) == 1 else "sampled"
    engine = params["engine"]
    user_attrs = {"config_kind": kind, "engine": engine, "engine_version": ENGINES[engine]["version"], **attrs}
    user_attrs.setdefault("constraint_violation", 0.0)
    dists = {k: DISTRIBUTIONS[k] for k in params}
    study.add_trial(
        optuna.trial.create_trial(params=params, distributions=dists, values=[value], user_attrs=user_attrs)
    )


def finalist(number: int, kind: str, mean: float) -> dict[str, Any]:
    stats = {"capacity_req_s": {"mean": mean, "low": mean * 0.95, "high": mean * 1.05, "n": 3}}
    return {"trial": number, "config_kind": kind, "failures": [], "stats": stats, "ttft_samples_ms": []}


@pytest.fixture
def capacity_study(tmp_path: Path) -> optuna.Study:
    study = optuna.create_study(study_name="cap", storage=f"sqlite:///{tmp_path / 'cap.db'}", direction="maximize")
    for key, value in {
        "objective": "capacity",
        "engines": ENGINES,
        "workload": "chat",
        "model": "/models/m",
        "hardware": {"name": "NVIDIA H200"},
    }.items():
        study.set_user_attr(key, value)
    add(study, {"engine": "vllm"}, {"launch": launch(VLLM, 41001), **capacity_attrs(2.0, 3.0)}, 2.0)
    add(study, {"engine": "sglang"}, {"launch": launch("sglang.launch_server", 41002), **capacity_attrs(1.5, 2.5)}, 1.5)
    tuned = {"engine": "vllm", "vllm.memory_fraction": NOISY, "vllm.max_num_seqs": 64}
    add(
        study,
        tuned,
        {"launch": launch(VLLM, 41003, "--gpu-memory-utilization", f"{NOISY:g}"), **capacity_attrs(4.0, 6.0)},
        4.0,
    )
    older = [
        "/opt/engine/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "41004",
        "--mem-fraction-static",
        "0.7",
    ]
    add(
        study,
        {"engine": "sglang", "sglang.mem_fraction_static": 0.7000000000000001},
        {"argv": older, **capacity_attrs(3.5, 5.0)},
        3.5,
    )
    add(
        study,
        {"engine": "vllm", "vllm.memory_fraction": 0.95, "vllm.max_num_seqs": 512},
        {"failure": "oom_boot", "constraint_violation": 1.0},
        0.0,
    )
    add(
        study,
        {"engine": "vllm", "vllm.memory_fraction": 0.5, "vllm.max_num_seqs": 8},
        {"capacity": {"tiers": {"interactive": {"steps": "not a list"}, "relaxed": None}}},
        0.0,
    )
    study.set_user_attr(
        "finalists",
        [
            finalist(2, "sampled", 4.1),
            finalist(3, "sampled", 3.6),
            finalist(0, "engine_default", 2.0),
            finalist(1, "engine_default", 1.5),
        ],
    )
    study.set_user_attr("verdict", {"kind": "tie", "metric": "capacity_req_s", "trials": [2, 3], "stress_failed": []})
    return study


@pytest.fixture
def pareto_study(tmp_path: Path) -> optuna.Study:
    """A throughput/latency study as before capacity: two objectives, a tie between two finalists."""
    study = optuna.create_study(
        study_name="pareto", storage=f"sqlite:///{tmp_path / 'p.db'}", directions=["minimize", "maximize"]
    )
    study.set_user_attr("engines", ENGINES)
    study.set_user_attr("workload", "rag")
    for number, (fraction, seqs, ttft, tps) in enumerate(
        [(NOISY, 64, 90.0, 900.0), (0.6, 128, 120.0, 1400.0), (0.45, 16, 150.0, 700.0)]
    ):
        attrs = {
            "launch": launch(VLLM, 42000 + number),
            "ttft_p95_ms": ttft,
            "output_throughput_tok_s": tps,
            "ttft_samples_ms": [ttft * f for f in (0.5, 0.8, 1.0)],
        }
        params = {"engine": "vllm", "vllm.memory_fraction": fraction, "vllm.max_num_seqs": seqs}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={k: DISTRIBUTIONS[k] for k in params},
                values=[ttft, tps],
                user_attrs={"config_kind": "sampled", "engine": "vllm", "constraint_violation": 0.0, **attrs},
            )
        )
    study.set_user_attr("verdict", {"kind": "tie", "metric": "output_throughput_tok_s", "trials": [1, 0]})
    return study
