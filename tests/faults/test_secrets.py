"""Secrets reach engines by environment variable only, and never land in what the tuner writes; and
every process the tuner starts on the way gets an argv list, never a shell string.

A real study (fault engines, real processes) runs with ``HF_TOKEN`` and API-key variables set; the
engine must see them in its environment, and their values must appear nowhere in the study
database, the exports, the report, the trial logs, or what the commands print.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import FrozenTrial

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, exited, lost, run_cli
from tests.faults.outcomes import NO_NEXT_RUN, FaultRow, observing

SECRETS = {
    "HF_TOKEN": "hf_SecretToken0123456789abcdef",
    "VLLM_API_KEY": "sk-vllm-SecretKey-0123456789",
    "OPENAI_API_KEY": "sk-proj-SecretKey-abcdef0123",
}


def test_secrets_are_passed_by_environment_and_written_nowhere(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    injected = f"{', '.join(SECRETS)} set while a study ran, was exported and reported"
    with observing("secrets-in-environment", injected) as row:
        row.recorded, row.resumed = "n/a", NO_NEXT_RUN
        _run_everything_and_look(study, engine, tmp_path, monkeypatch, row)


def _run_everything_and_look(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: FaultRow
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TUNER_FAULT_RECORD_ENV", "HF_TOKEN,VLLM_API_KEY,OPENAI_API_KEY")
    started: list[tuple[Any, object]] = []  # (args, shell): args as Popen took them
    popen = subprocess.Popen.__init__

    def recording(self: subprocess.Popen[bytes], args: object, *rest: object, **kwargs: object) -> None:
        started.append((args, kwargs.get("shell", False)))
        popen(self, args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess.Popen, "__init__", recording)
    printed: list[str] = []
    searched: list[FrozenTrial] = []
    for args in (
        ["search", *study.flags, "--trials", "2"],
        ["trials", "--study", study.name, "--storage", study.storage],
        ["export", "--study", study.name, "--storage", study.storage, "--out", str(tmp_path / "launch"),
         "--engine-env", f"vllm={engine.python}", *sum((["--format", f] for f in
                                                         ("sh", "json", "python", "compose", "k8s")), [])],
        ["report", "--study", study.name, "--storage", study.storage, "--out", str(tmp_path / "report")],
    ):  # fmt: skip
        code, err = run_cli(args)
        row.saw(exited(code, err, f"`tuner {args[0]}`"))
        assert code == 0, err
        printed.append(err)
        searched = study.trials() if args[0] == "search" else searched
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    shells = sum(shell is not False or not isinstance(a, list | tuple) for a, shell in started)
    seen = [e for e in engine.events() if e.split()[1:2] == ["env"]]
    row.saw(f"started {len(started)} processes, {shells} of them through a shell or from a string",
            f"{sum(e.split()[2:] == sorted(SECRETS) for e in seen)} of {engine.boots()} engines "
            "had every secret in their environment")  # fmt: skip
    assert started and all(isinstance(a, list | tuple) and shell is False for a, shell in started), started
    assert sum("tuner.measure.reaper" in a for a, _ in started) == 2, "both engines, each started as an argv list"
    assert seen and all(e.split()[2:] == sorted(SECRETS) for e in seen), "every engine got them, by environment"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "engine" not in p.parts]
    kinds = {".db", ".sh", ".json", ".py", ".yaml", ".html", ".md", ".log"}
    leaks = [(str(p), name) for p in written for name, value in SECRETS.items() if value.encode() in p.read_bytes()]
    leaks += [("stderr", name) for text in printed for name, value in SECRETS.items() if value in text]
    row.saw(f"scanned {len(written)} files ({', '.join(sorted({p.suffix for p in written} & kinds))}) and what "
            f"the commands printed: {len(leaks)} secret values found")  # fmt: skip
    row.processes_left = len(procs.left_after(10.0))
    assert kinds <= {p.suffix for p in written}, sorted({p.suffix for p in written})
    assert leaks == []
    manifest = json.loads(next((tmp_path / "launch").glob("*.json")).read_text())
    assert not any(v in json.dumps(manifest) for v in SECRETS.values())
    row.trials_lost = lost(searched, study.trials())  # what the export and the report did to the study
