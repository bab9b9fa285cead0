"""What the tuner runs and writes is safe: no shell anywhere, every launch-file value quoted, no name
that escapes its folder, YAML loaded safely, the dashboard on loopback by default.

(Secrets are checked on a real study in ``tests/faults/test_secrets.py``; the dashboard's real
listening address in ``tests/storage/test_dashboard.py``.)
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli.main import build_parser, main
from tuner.deploy.export import safe_stem
from tuner.deploy.formats import (
    read_container_args,
    read_launcher,
    read_sh,
    render_compose,
    render_k8s,
    render_python,
    render_sh,
)
from tuner.naming import safe_name
from tuner.study.storage import storage_url
from tuner.workloads.trace import Trace

PACKAGE = Path(__file__).resolve().parents[3] / "tuner"
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}
FORBIDDEN = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
             ("yaml", "load"), ("yaml", "load_all"), ("yaml", "full_load"), ("yaml", "unsafe_load")}  # fmt: skip
# Values a shell, YAML or Python would read as something else if they were not quoted.
NASTY = st.text(alphabet=st.sampled_from(list("ab /'\"$`\\;&|<>(){}[]*?!#~%=:,\n\t-.") + ["é", "\x1b"]), max_size=24)


def _calls(path: Path) -> list[tuple[ast.Call, str, str]]:
    """Every ``module.name(...)`` call in a source file, as (node, module, name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            found.append((node, owner.id if isinstance(owner, ast.Name) else "", node.func.attr))
    return found


def test_no_command_goes_through_a_shell_and_no_yaml_is_loaded_unsafely() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 40
    problems = []
    for path in sources:
        for node, module, name in _calls(path):
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            if (module, name) in FORBIDDEN:
                problems.append(f"{where}: {module}.{name}")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    problems.append(f"{where}: shell={ast.unparse(kw.value)}")
            literal = bool(node.args) and isinstance(node.args[0], ast.Constant | ast.JoinedStr | ast.BinOp)
            if module == "subprocess" and name in SUBPROCESS_CALLS and literal:
                problems.append(f"{where}: a command string, not an argv list")
    assert problems == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scan above must be able to fail."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os, subprocess, yaml\nos.system('x')\nsubprocess.run('ls', shell=True)\nyaml.load(s)\n")
    found = [(m, n) for _, m, n in _calls(bad)]
    assert ("os", "system") in found and ("yaml", "load") in found
    assert any(kw.arg == "shell" for node, _, _ in _calls(bad) for kw in node.keywords)


def _manifest(argv: list[str], model: str) -> dict[str, object]:
    """A launch manifest as ``tuner.deploy.export.manifest`` makes one, with user-given values where they go."""
    return {"engine": "vllm", "engine_version": "0.32.0", "module": "vllm.entrypoints.openai.api_server",
            "python": "/envs/vllm/bin/python", "argv": argv, "model": model, "study": model, "trial": 1,
            "tuner_version": "0", "exported_at": "now", "config_kind": "sampled", "distribution": "vllm",
            "hardware": {"name": model}, "workload": model, "workload_digest": "d" * 64,
            "objectives": {"ttft_p95_ms": 1.0}, "parser_check": {"ok": True}}  # fmt: skip


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(NASTY, min_size=1, max_size=6), NASTY)
def test_every_launch_file_keeps_each_value_one_argument(values: list[str], model: str) -> None:
    argv = ["--model", model, *values]
    m = _manifest(argv, model)
    assert read_sh(render_sh(m)) == (m["module"], argv)
    assert read_launcher(render_python(m, ["# header"])) == (m["module"], argv)
    for render in (render_compose, render_k8s):
        assert read_container_args(render(m, ["# header"])) == (m["module"], argv)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(st.lists(NASTY, min_size=1, max_size=5))
def test_bash_runs_the_launch_file_with_exactly_its_argv(tmp_path: Path, values: list[str]) -> None:
    """The ``.sh`` really run by bash, with an interpreter that records what it was given: the same
    argv, and no side effect (``$(touch ...)`` and friends never run)."""
    record = tmp_path / "argv.json"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    fake.chmod(0o755)
    argv = [*values, "--touch", f"$(touch {tmp_path}/pwned)", f"`touch {tmp_path}/pwned`"]
    script = tmp_path / "launch.sh"
    script.write_text(render_sh(_manifest(argv, "/m")))
    env = {"PATH": os.environ["PATH"], "ENGINE_PYTHON": str(fake), "PORT": "1"}
    subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, check=True, capture_output=True, timeout=20)
    assert json.loads(record.read_text()) == ["-m", "vllm.entrypoints.openai.api_server", *argv,
                                              "--host", "127.0.0.1", "--port", "1"]  # fmt: skip
    assert not (tmp_path / "pwned").exists()


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=40))
def test_no_name_from_user_input_leaves_its_folder(name: str) -> None:
    """Study names (export stems, report and log folders, the SQLite file) and trace file names."""
    base = Path("/srv/out")
    for derived in (safe_name(name), safe_stem(name, 3), Trace(Path(name or "x"), ()).name):
        path = (base / derived).resolve()
        assert path.parent == base and derived not in ("", ".", ".."), (name, derived)


def test_the_default_sqlite_file_stays_in_studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    for name in ("../../etc/owned", "/abs/path", "a/../../b", "..", "rag-vllm"):
        url = storage_url(name, None)
        path = Path(url.removeprefix("sqlite:///")).resolve()
        assert path.parent == (tmp_path / "studies").resolve(), (name, url)
    assert storage_url("rag-vllm", None) == "sqlite:///studies/rag-vllm.db", "plain names unchanged"


def test_a_yaml_tag_that_would_run_code_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "evil.yaml"
    space.write_text(f'engines: !!python/object/apply:os.system ["touch {tmp_path}/pwned"]\n')
    assert main(["plan", "--workload", "rag", "--space", str(space), "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not valid YAML" in err, err
    assert not (tmp_path / "pwned").exists()


def test_the_dashboard_listens_on_loopback_unless_told_otherwise() -> None:
    assert build_parser().parse_args(["dashboard", "--study", "s"]).host == "127.0.0.1"
    assert build_parser().parse_args(["dashboard", "--study", "s", "--host", "0.0.0.0"]).host == "0.0.0.0"
