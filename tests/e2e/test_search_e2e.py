"""End to end on the real vLLM CPU build: a capacity search, record, export, check, serve the export.

One study of 5 boots, scored by capacity under both SLO tiers (``--objective capacity-pareto``), is
shared by the tests of this module (every boot costs about 20-40 s, every capacity search a few steps):
trial 0 is enqueued with a KV-cache share too small for the max model length, so it must fail at
boot as ``kv_insufficient`` and the study must go on; trial 1 asks for an even smaller share, which
the memory screen must then reject without booting; trial 2 is the engine's default config. The
finalist's last repeat runs the stress check, and each tier's winner is verified by vLLM's own
client. The speculative methods have a study of their own (``test_methods_e2e``), which a parallel
test run serves beside this one. Sampled trials are the fault suite's and the sampler benchmark's to
exercise: here they would add a boot.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import optuna
import pytest

from tests.e2e.conftest import ROOT, capacity_of, engine_processes, search_study, tuner
from tuner.deploy.verify import read_launch_file
from tuner.measure.process import free_port
from tuner.search.scoring import directions
from tuner.search.space import load_space
from tuner.workloads import rag
from tuner.workloads.lengths import fit_scale

MAX_MODEL_LEN = load_space().static.max_model_len
# The module's shared study (five boots, a capacity search, a finalist, --verify) is set up inside the
# first test's time: on a busy two-core machine it has come close to the suite's 900 s per test, so
# this module alone gets more before a hang is called one.
pytestmark = [pytest.mark.engine(boots=7), pytest.mark.timeout(1500)]  # the study's 5, the export, Ctrl-C
STUDY = "e2e"
BASE = {"engine": "vllm", "vllm.chunk_size": 512, "vllm.max_num_seqs": 4}


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('study') / 'e2e.db'}"


def _search(storage: str, trials: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return search_study(STUDY, storage, trials, *extra)


@pytest.fixture(scope="module")
def study(storage: str) -> optuna.Study:
    pre = optuna.create_study(study_name=STUDY, storage=storage, directions=directions("capacity-pareto"))
    for fraction in (0.08, 0.04):  # under one max_model_len of KV cache in the CPU budget, both
        pre.enqueue_trial({**BASE, "vllm.memory_fraction": fraction, "vllm.spec_method": "off"})
    done = _search(
        storage, 2, "--finalists", "1", "--repeats", "1",
        "--verify",  # each tier's winner booted again from its exported .sh, checked by vLLM's client
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The default space holds both engines; on a machine without a GPU SGLang is left out, said once.
    assert done.stderr.count("sglang: left out of this study") == 1, done.stderr[:2000]
    for phase in ("boot", "warmup", "step", "score"):
        assert f" {phase} " in done.stderr, f"no {phase} progress line"
    return optuna.load_study(study_name=STUDY, storage=storage)


def _searched(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.user_attrs.get("config_kind") != "stress_check"]


def test_kv_too_small_is_recorded_infeasible_and_the_study_goes_on(study: optuna.Study) -> None:
    trials = _searched(study)
    assert len(trials) == 3
    failed = trials[0]
    assert failed.state == optuna.trial.TrialState.COMPLETE
    assert failed.user_attrs["failure"] == "kv_insufficient"
    assert failed.user_attrs["constraint_violation"] > 0
    assert "KV cache is needed" in failed.user_attrs["log_tail"]
    assert failed.values == [0.0, 0.0], "no capacity under either tier"
    # vLLM's own figure: the longest model length that would have fit in 0.08 x 32 MiB
    assert 0 < failed.user_attrs["memory_facts"]["max_len_fit"] < MAX_MODEL_LEN
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials[1:])


def test_the_screen_learns_from_the_real_failure_and_boots_nothing(study: optuna.Study) -> None:
    screened = _searched(study)[1]
    assert screened.user_attrs["failure"] == "screened" and screened.user_attrs["constraint_violation"] > 0
    estimate = screened.user_attrs["memory_estimate"]
    assert estimate["fits"] is False and "0.08 ran out of memory" in estimate["basis"]
    assert not Path(screened.user_attrs["log_path"] or "/nonexistent").exists(), "no engine was started"
    booted = [t for t in _searched(study) if t.user_attrs["failure"] != "screened"]
    assert len(booted) == 2, "--trials 2 counts boots"
    served = [t for t in booted if t.user_attrs["failure"] is None]
    assert all(t.user_attrs["memory_facts"]["kv_tokens"] > MAX_MODEL_LEN for t in served), "vLLM's KV cache size, read"


def test_default_config_is_enqueued_and_measured(study: optuna.Study) -> None:
    default = _searched(study)[2]
    assert default.user_attrs["config_kind"] == "engine_default"
    assert default.params == {"engine": "vllm"}
    assert not any(a.startswith("--max-num-batched-tokens") for a in default.user_attrs["launch"]["args"])


def test_feasible_trials_carry_finite_metrics_and_attributes(study: optuna.Study) -> None:
    feasible = [
        t
        for t in study.get_trials()
        if t.user_attrs.get("failure") is None and t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert feasible, "no trial served"
    for t in feasible:
        attrs = t.user_attrs
        assert math.isfinite(attrs["ttft_p95_ms"]) and attrs["ttft_p95_ms"] > 0
        assert attrs["output_throughput_tok_s"] > 0
        assert t.values == [attrs["capacity_interactive_req_s"], attrs["capacity_relaxed_req_s"]]
        for tier, searched in attrs["capacity"]["tiers"].items():
            steps = searched["steps"]
            assert steps and searched["slo"] and searched["target"] == 0.9, tier
            assert attrs[f"capacity_{tier}_req_s"] == capacity_of(steps, 0.9), "the highest pass below every fail"
            assert all(s["ttft_p95_ms"] is None or s["ttft_p95_ms"] > 0 for s in steps)
        assert attrs["slo"]["tier"] == "interactive" and attrs["slo"]["attainment"] == 0.9
        assert attrs["engine"] == "vllm" and attrs["engine_version"] == "0.32.0"
        assert attrs["launch"]["module"] == "vllm.entrypoints.openai.api_server"
        assert attrs["metrics"]["error_rate"] <= 0.005 and attrs["metrics"]["n_requests"] >= 10
        assert attrs["peak_memory_bytes"] > 50 * 2**20
        assert attrs["served_by"]["owned_by"] == ["vllm"] and attrs["served_by"]["version"] == "0.32.0"
        assert attrs["server"]["prefix_cache_hit_rate"] is not None
        assert attrs["server"]["server_ttft_mean_ms"] > 0
        # the log is vLLM's own (tests/data/captures/vllm-0.32-cpu), and its tail ends with the trial's requests
        assert "Starting vLLM server on http://127.0.0.1:" in Path(attrs["log_path"]).read_text()
        assert '"POST /v1/completions HTTP/1.1" 200 OK' in attrs["log_tail"], attrs["log_tail"][-2000:]
        assert "Traceback" not in attrs["log_tail"]
    assert study.user_attrs["workload"] == "rag" and len(study.user_attrs["workload_digest"]) == 64


def test_trials_command_prints_the_table(study: optuna.Study, storage: str) -> None:
    done = tuner("trials", "--study", STUDY, "--storage", storage)
    assert done.returncode == 0, done.stderr
    assert "kv_insufficient" in done.stdout and "engine defaults" in done.stdout and "screened" in done.stdout
    # header, trials, legend, one SLO line per tier, what tok/s/GPU is, effort, what vLLM changed, verdict
    assert len(done.stdout.splitlines()) == 1 + len(study.trials) + 3 + 3 + 1, done.stdout
    booted = ", ".join(str(t.number) for t in study.trials if t.user_attrs.get("booted"))
    # the CPU build logs its model-runner fallback in every boot, the one the KV pool refused included
    assert f"vllm changed the config: the V1 model runner (V2 requires Triton) (trials {booted})" in done.stdout
    assert "tok/s/GPU" in done.stdout.splitlines()[0] and "(--gpu-price to price them)" in done.stdout
    assert "SLO interactive: " in done.stdout and "SLO relaxed: " in done.stdout
    assert "screened by the memory screen" in done.stdout
    assert "verdict: " in done.stdout and " n=1" in done.stdout


def test_finalists_are_repeated_on_fresh_boots(study: optuna.Study) -> None:
    finalists = study.user_attrs["finalists"]
    assert 2 in [f["trial"] for f in finalists], "the engine default is always repeated as the reference"
    for f in finalists:
        assert f["failures"] == [] and f["stats"]["output_throughput_tok_s"]["n"] == 1
        assert f["stats"]["ttft_p95_ms"]["mean"] > 0 and f["ttft_samples_ms"]
    # one repeat each cannot separate two configs: the verdict must not crown a winner
    assert study.user_attrs["verdict"]["kind"] in ("tie", "sole", "none")


def test_finalists_are_stress_checked_at_peak_load_on_their_last_repeat(study: optuna.Study) -> None:
    checks = study.user_attrs["stress"]
    assert {int(n) for n in checks} >= {f["trial"] for f in study.user_attrs["finalists"]}
    longest = rag.PROMPT_TOKENS.high * fit_scale("rag", MAX_MODEL_LEN, rag.NEEDED)  # rag's, at this context
    for check in checks.values():
        # the workload's longest prompts, at the peak concurrency
        assert check["ran"] and check["concurrency"] == 4 and check["prompt_tokens"] > 0.8 * longest
        assert check["n_requests"] == 8 and check["error_rate"] == 0.0
        assert check["failure"] in (None, "slo_collapse"), check
    failed = [int(n) for n, c in checks.items() if c["failure"]]
    marked = [t.user_attrs["stress_of"] for t in study.trials if t.user_attrs.get("config_kind") == "stress_check"]
    assert sorted(marked) == sorted(failed)


def test_report_renders_in_a_real_browser(study: optuna.Study, storage: str, tmp_path: Path) -> None:
    done = tuner("report", "--study", STUDY, "--storage", storage, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    page = tmp_path / STUDY / "index.html"
    summary = (tmp_path / STUDY / "summary.md").read_text()
    assert summary.startswith(f"# Study {STUDY}")
    for tier, report in study.user_attrs["verify"].items():  # --verify's checks, as the search stored them
        assert f"- {tier}: trial {report['trial']} (vllm " in summary, summary
    booted = [t for t in study.get_trials() if t.user_attrs.get("phases_s", {}).get("boot")]
    assert f"| {booted[0].number} | vllm | " in summary.split("## What each trial cost")[1], summary
    repeats = summary.split("## The finalists' fresh-boot repeats")[1].split("## What each trial cost")[0]
    for finalist in study.user_attrs["finalists"]:  # each with its repeats' figures, then the verdict
        assert f"| {finalist['trial']} | vllm " in repeats and " n=" in repeats, repeats
    assert "verdict: " in repeats, repeats
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chrome'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        browser.set_window_size(1200, 2400)
        browser.get(page.as_uri())
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[no-untyped-call]
        assert errors == [], errors
        assert browser.execute_script("return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        sections = (
            "capacity",
            "capacity-table",
            "best-vs-default",
            "importance",
            "failure-map",
            "acceptance",
            "trial-costs",
            "verified",
            "launch",
        )
        for section in sections:
            assert browser.find_element("id", section).is_displayed(), section
        drawn = browser.execute_script(  # Plotly marks a div it has drawn with the class js-plotly-plot
            "return Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => e.id)"
        )
        assert {"capacity-plot-0", "capacity-plot-1"} <= set(drawn), drawn
        assert browser.save_screenshot(str(tmp_path / "report.png"))
        assert (tmp_path / "report.png").stat().st_size > 10_000
    finally:
        browser.quit()


def test_export_is_checked_by_vllm_and_serves(study: optuna.Study, storage: str, tmp_path: Path) -> None:
    formats = ["--format", "sh", "--format", "json", "--format", "python", "--format", "compose", "--format", "k8s"]
    done = tuner("export", "--study", STUDY, "--storage", storage, "--out", str(tmp_path), *formats)
    assert done.returncode == 0, done.stderr
    scripts = sorted(tmp_path.glob("*.sh"))
    assert scripts and len(scripts) == len(list(tmp_path.glob("*.json")))
    manifest = json.loads(scripts[0].with_suffix(".json").read_text())
    assert manifest["parser_check"]["ok"] is True
    for key in ("study", "trial", "metrics", "ci", "engine", "engine_version", "hardware", "model", "workload"):
        assert manifest[key] is not None, key
    files = sorted(p for p in tmp_path.iterdir() if p.is_file())
    assert {p.name.split(".", 1)[1] for p in files} == {"sh", "json", "py", "compose.yaml", "k8s.yaml"}
    # the exported script boots while vLLM's parser checks every format: neither waits for the other
    with _serving_exported(scripts[0], tmp_path) as (proc, base):
        checked = tuner("check", *map(str, files))  # every format, through vLLM's own parser, in one run
        assert checked.returncode == 0, checked.stderr
        assert checked.stdout.count("accepted by vllm 0.32.0") == len(files)
        _answers(proc, base, tmp_path)


@contextlib.contextmanager
def _serving_exported(script: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The exported script started on a free port in its own session, stopped (its group) on the way out."""
    port = free_port()
    with (workdir / "exported.log").open("wb") as log:
        proc = subprocess.Popen(
            ["bash", str(script)],
            env={**os.environ, "PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=workdir,
        )
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _answers(proc: subprocess.Popen[bytes], base: str, workdir: Path) -> None:
    """The exported server comes up and completes a request."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, (workdir / "exported.log").read_text()[-2000:]
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    model = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
    reply = httpx.post(
        base + "/v1/completions", timeout=60, json={"model": model, "prompt": "The tuner exports", "max_tokens": 8}
    ).json()
    assert reply["usage"]["completion_tokens"] == 8


def test_ctrl_c_during_boot_stops_the_engine_and_marks_the_trial_failed(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'interrupt.db'}"
    log = (tmp_path / "tuner.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner",
            "search",
            "--workload",
            "rag",
            "--study",
            "ctrlc",
            "--storage",
            storage,
            "--trials",
            "2",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    while not engine_processes() and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "tuner.log").read_text()
        time.sleep(0.5)
    assert engine_processes(), "the engine never started"
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert not engine_processes()
    trials = optuna.load_study(study_name="ctrlc", storage=storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL]
    assert "interrupted" in (tmp_path / "tuner.log").read_text()


def test_verify_boots_each_tiers_winner_and_vllms_client_judges_it(study: optuna.Study) -> None:
    """`tuner search --verify`: the exported .sh of each tier's winner booted on its own, then
    `vllm bench serve` at its capacity and 1.2x it, judged per request as a step is."""
    reports = study.user_attrs["verify"]
    assert set(reports) == {"interactive", "relaxed"}
    for tier, report in reports.items():
        assert "error" not in report, report
        trial = next(t for t in study.get_trials() if t.number == report["trial"])
        launch_file = Path(report["launch_file"])
        assert launch_file.suffix == ".sh" and launch_file.is_file(), report["launch_file"]
        assert read_launch_file(launch_file)[1] == trial.user_attrs["launch"]["args"], "the file is the trial's command"
        capacity = trial.user_attrs["metrics"][f"capacity_{tier}_req_s"]
        assert capacity > 0 and report["engine"] == "vllm"
        assert [r["share"] for r in report["runs"]] == [1.0, 1.2]
        assert [r["rate_req_s"] for r in report["runs"]] == pytest.approx([capacity, 1.2 * capacity])
        for run in report["runs"]:
            assert "vllm.benchmarks" in run["argv"][2], "vLLM's own client ran"
            assert run["prefix_cache_reset"] is True, "the verify boot has the dev endpoint a trial's boot has"
            assert set(run["tiers"]) == {tier} and run["goal_met"].keys() == {tier}
            verdict = run["tiers"][tier]
            assert 0.0 <= verdict["attainment"] <= 1.0 and 0 < verdict["n_counted"] <= verdict["n_requests"]
