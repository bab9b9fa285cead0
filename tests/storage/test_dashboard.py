"""`tuner dashboard` starts the real optuna-dashboard on a study's storage, on loopback by default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tests.storage.test_storage import _result, _run
from tuner.measure.process import free_port
from tuner.search.samplers import make_sampler
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import bind_study_attrs
from tuner.study.storage import open_study

ROOT = Path(__file__).resolve().parents[2]


def test_dashboard_lists_the_study_and_the_trials_user_attributes(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'dash.db'}"
    study = open_study("dash", storage, DIRECTIONS, make_sampler("tpe", 0))
    bind_study_attrs(study, {"workload": "rag", "workload_digest": "c" * 64})
    _run(study, _result(123.0, 45.0))
    _run(study, _result(1.0, 1.0, failure="kv_insufficient"))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "dashboard", "--storage", storage, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "dashboard.log").open("wb"),
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        studies = _wait_json(base + "/api/studies", proc)
        assert [s["study_name"] for s in studies["study_summaries"]] == ["dash"]
        detail = httpx.get(f"{base}/api/studies/{studies['study_summaries'][0]['study_id']}", timeout=10).json()
        attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in detail["trials"]]
        assert attrs[0]["ttft_p95_ms"] == "123.0" and attrs[0]["failure"] == "null"
        assert attrs[1]["failure"] == "kv_insufficient"
        listening = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections() if c.status == "LISTEN"}
        assert listening == {"127.0.0.1"}, "the dashboard must bind to loopback unless told otherwise"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a user stops it
        proc.wait(timeout=20)


def _wait_json(url: str, proc: subprocess.Popen[bytes]) -> dict[str, list[dict[str, object]]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the dashboard exited"
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == 200:
                body: dict[str, list[dict[str, object]]] = response.json()
                return body
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} never answered")
