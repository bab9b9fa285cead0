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

import pytest

from tests.faults.harness import FaultEngine, Study, run_cli
from tests.faults.outcomes import FaultRow, record_fault

SECRETS = {
    "HF_TOKEN": "hf_SecretToken0123456789abcdef",
    "VLLM_API_KEY": "sk-vllm-SecretKey-0123456789",
    "OPENAI_API_KEY": "sk-proj-SecretKey-abcdef0123",
}


def test_secrets_are_passed_by_environment_and_written_nowhere(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TUNER_FAULT_RECORD_ENV", "HF_TOKEN,VLLM_API_KEY,OPENAI_API_KEY")
    started: list[tuple[object, object]] = []
    popen = subprocess.Popen.__init__

    def recording(self: subprocess.Popen[bytes], args: object, *rest: object, **kwargs: object) -> None:
        started.append((args, kwargs.get("shell", False)))
        popen(self, args, *rest, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", recording)
    printed = []
    for args in (
        ["search", *study.flags, "--trials", "2"],
        ["trials", "--study", study.name, "--storage", study.storage],
        ["export", "--study", study.name, "--storage", study.storage, "--out", str(tmp_path / "launch"),
         "--engine-env", f"vllm={engine.python}", *sum((["--format", f] for f in
                                                         ("sh", "json", "python", "compose", "k8s")), [])],
        ["report", "--study", study.name, "--storage", study.storage, "--out", str(tmp_path / "report")],
    ):  # fmt: skip
        code, err = run_cli(args)
        assert code == 0, err
        printed.append(err)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    assert started and all(isinstance(a, list | tuple) and shell is False for a, shell in started), started
    assert sum("tuner.measure.reaper" in a for a, _ in started) == 2, "both engines, each started as an argv list"
    seen = [e for e in engine.events() if e.split()[1:2] == ["env"]]
    assert seen and all(e.split()[2:] == sorted(SECRETS) for e in seen), "every engine got them, by environment"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "engine" not in p.parts]
    kinds = {".db", ".sh", ".json", ".py", ".yaml", ".html", ".md", ".log"}
    assert kinds <= {p.suffix for p in written}, sorted({p.suffix for p in written})
    leaks = [(str(p), name) for p in written for name, value in SECRETS.items() if value.encode() in p.read_bytes()]
    leaks += [("stderr", name) for text in printed for name, value in SECRETS.items() if value in text]
    assert leaks == []
    manifest = json.loads(next((tmp_path / "launch").glob("*.json")).read_text())
    assert not any(v in json.dumps(manifest) for v in SECRETS.values())
    record_fault(FaultRow("secrets-in-environment", f"{', '.join(SECRETS)} set while a study ran, "
                          "was exported and reported", f"passed them to the engines by environment only; "
                          f"scanned {len(written)} files (database, exports, report, logs) and the output: "
                          "no value found", "n/a", 0, 0, True))  # fmt: skip
