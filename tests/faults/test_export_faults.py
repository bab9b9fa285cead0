"""``tuner export`` interrupted: by SIGINT or SIGTERM while the engine's parser checks the commands,
and by Ctrl-C while the files are being written. No half-written export may be left, ever."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, exited, lost, run_cli, spawn
from tests.faults.outcomes import NO_NEXT_RUN, observing

READ_ONLY = "n/a (the study is only read)"
EXPORTED = ["faults-trial0.json", "faults-trial0.k8s.yaml", "faults-trial0.sh"]


def _export_args(study: Study, engine: FaultEngine, out: Path) -> list[str]:
    formats = ["--format", "sh", "--format", "json", "--format", "k8s"]
    return ["export", "--study", study.name, "--storage", study.storage, "--out", str(out),
            "--engine-env", f"vllm={engine.python}", *formats]  # fmt: skip


def _whole(out: Path) -> list[str]:
    """The export's files, each checked complete: the manifest parses, the script ends its command."""
    names = sorted(p.name for p in out.iterdir())
    for path in out.glob("*.json"):
        assert json.loads(path.read_text())["argv"]
    for path in out.glob("*.sh"):
        assert path.read_text().rstrip().endswith('--host "$HOST" --port "$PORT"') and os.access(path, os.X_OK)
    return names


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_export_leaves_no_export(
    sig: signal.Signals, study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with observing(f"{sig.name}-during-export", f"{sig.name} to `tuner export` during its parser check") as row:
        row.recorded = READ_ONLY
        assert study.search(1)[0] == 0
        before = study.trials()
        out = tmp_path / "launch"
        monkeypatch.setenv("TUNER_FAULT_CHECK_SLEEP", "30")
        proc = spawn([*procs_python(), *_export_args(study, engine, out)], tmp_path, tmp_path / "export.log")
        engine.wait_for("check")
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        log = (tmp_path / "export.log").read_text()
        row.saw(exited(code, log, "the export"), _written(out, tmp_path))
        assert code == 130 and "tuner: interrupted" in log and "Traceback" not in log, log
        assert not out.exists() and not list(tmp_path.glob(".launch.tuner-export-*")), "nothing half-written"
        left = procs.left_after(10.0)
        row.processes_left = len(left)
        assert not left, "the parser check was stopped too"

        monkeypatch.setenv("TUNER_FAULT_CHECK_SLEEP", "0")
        code, err = run_cli(_export_args(study, engine, out))
        row.trials_lost = lost(before, study.trials())
        row.saw(exited(code, err, "the next export"), _written(out, tmp_path))
        assert code == 0, err
        files = _whole(out)
        row.resumed = files == EXPORTED  # the export after the fault wrote every file, each whole
        assert files == ["faults-trial0.json", "faults-trial0.k8s.yaml", "faults-trial0.sh"]


def _written(out: Path, beside: Path) -> str:
    """What an export left: the files in its folder (a staging folder is a dot name among them) and any
    staging folder beside it."""
    staging = [p.name for p in beside.glob(f".{out.name}.tuner-export-*")]
    names = sorted(p.name for p in out.iterdir()) if out.exists() else None
    held = f"no {out.name}/" if names is None else f"{out.name}/ holds {', '.join(names) or 'nothing'}"
    return held + (f"; beside it {', '.join(staging)}" if staging else "")


def procs_python() -> list[str]:
    import sys

    return [sys.executable, "-m", "tuner"]


@pytest.mark.parametrize("when", ["staging", "moving"])
def test_ctrl_c_while_writing_leaves_the_old_export_or_the_whole_new_one(
    when: str, study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into a folder that holds an earlier export: SIGINT while the new files are written (the old
    ones must stay as they were) or while they are moved into place (held until all are there)."""
    target = "write_text" if when == "staging" else "replace"
    with observing(f"SIGINT-while-writing-{when}",
                   f"SIGINT to `tuner export` while {target} ran over an earlier export") as row:  # fmt: skip
        row.recorded, row.resumed = READ_ONLY, NO_NEXT_RUN
        assert study.search(1)[0] == 0
        before = study.trials()
        out = tmp_path / "launch"
        out.mkdir()
        (out / "faults-trial0.sh").write_text("old\n")
        calls = {"n": 0}
        original: Callable[..., object] = Path.write_text if when == "staging" else os.replace

        def interrupting(*args: object, **kwargs: object) -> object:
            calls["n"] += 1
            result = original(*args, **kwargs)
            if calls["n"] == 2:
                os.kill(os.getpid(), signal.SIGINT)  # a real signal, as a user's Ctrl-C arrives
            return result

        if when == "staging":
            monkeypatch.setattr(Path, "write_text", interrupting)
        else:
            monkeypatch.setattr("tuner.deploy.atomic.os.replace", interrupting)
        code, err = run_cli(_export_args(study, engine, out))
        monkeypatch.undo()
        old = (out / "faults-trial0.sh").read_text() == "old\n"
        row.saw(exited(code, err, "the export"),
                _written(out, tmp_path) + (" (the earlier script as it was)" if old else ""))  # fmt: skip
        row.trials_lost, row.processes_left = lost(before, study.trials()), len(procs.left_after(10.0))
        assert code == 130 and "interrupted" in err, err
        if when == "staging":
            assert sorted(p.name for p in out.iterdir()) == ["faults-trial0.sh"]
            assert (out / "faults-trial0.sh").read_text() == "old\n", "the earlier export is untouched"
        else:
            assert _whole(out) == ["faults-trial0.json", "faults-trial0.k8s.yaml", "faults-trial0.sh"]
        assert not [p for p in out.iterdir() if p.name.startswith(".")], "no staging folder left"
