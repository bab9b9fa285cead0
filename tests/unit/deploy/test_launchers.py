"""Python launch files (``sglang.Runtime(**KWARGS)``): argv <-> kwargs, render/read round trips, code safety.

The rendered file is also run, with a stand-in ``sglang`` package whose ``Runtime`` writes the keyword
arguments it received as JSON and exits, so what a user would start is checked, not only the text.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.deploy.export import manifest
from tuner.deploy.formats import argv_to_kwargs, kwargs_to_argv, read_python, render_python
from tuner.deploy.provenance import provenance
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.sglang import SglangAdapter
from tuner.errors import ExportError
from tuner.measure.trial import TrialResult
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import bind_study_attrs

PYTHON = "/envs/sglang/bin/python"
VERSION = "0.5.23"
DEVICE = Device("cuda", "NVIDIA H200", 150_754_820_096)
INJECTION = '/models/x"; touch pwned; "y'
CODE_IN_NEWLINES = "/models/m\nimport os; os.system('touch pwned')\n"
PARAMS: dict[str, Any] = {
    "chunk_size": 1024,
    "max_num_seqs": 8,
    "memory_fraction": 0.85,
    "num_speculative_tokens": 3,
    "draft_model": "draft-2l",
}
MODEL_PATHS = [
    "/models/target",
    '/models/my model\'s "v2"',
    INJECTION,
    "/models/$HOME `id` $(touch pwned) \\ *",
    "/models/" + "very-long-folder-name/" * 8 + "target",  # pprint wraps long strings over lines
    CODE_IN_NEWLINES,
]

# render_python currently fails on every call; each test that renders a file is marked with this.
FAKE_SGLANG = """\
import json, os

class Runtime:
    def __init__(self, **kwargs):
        with open(os.environ["KWARGS_OUT"], "w") as fh:
            json.dump(kwargs, fh)
        os._exit(0)
"""


def _sglang_args(model_path: str, params: dict[str, Any]) -> list[str]:
    """The engine args (no python, module, host or port) SGLang gets for ``params``."""
    model = ModelSpec(path=model_path, drafts={"draft-2l": model_path + "/../draft two"}, max_model_len=2048)
    launch = SglangAdapter().launch(Config("sglang", params), model, DEVICE, 43210, PYTHON, VERSION)
    assert launch.module == SglangAdapter.module
    return list(launch.args)


def _manifest(model_path: str, params: dict[str, Any], study_name: str = "launch-test") -> dict[str, Any]:
    """A manifest as ``tuner export`` builds it, for one recorded SGLang trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, directions=DIRECTIONS)
    bind_study_attrs(
        study,
        {
            "workload": "rag",
            "workload_digest": "d" * 64,
            "model": model_path,
            "drafts": {},
            "hardware": {"kind": DEVICE.kind, "name": DEVICE.name, "memory_bytes": DEVICE.memory_bytes},
            "engines": {"sglang": {"distribution": "sglang", "version": VERSION}},
        },
    )
    model = ModelSpec(path=model_path, drafts={"draft-2l": model_path + "/../draft two"}, max_model_len=2048)
    config = Config("sglang", params)
    launch = SglangAdapter().launch(config, model, DEVICE, 43210, PYTHON, VERSION)
    metrics = {"ttft_p95_ms": 120.0, "output_throughput_tok_s": 75.0, "error_rate": 0.0}
    trial = study.ask()
    study.tell(trial, list(record(trial, TrialResult(config, launch, VERSION, metrics=metrics), "pareto")))
    return manifest(study, study.get_trials(deepcopy=False)[trial.number])


def _run_launcher(tmp_path: Path, text: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the launch file with a stand-in sglang; return the keyword arguments Runtime received."""
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text(FAKE_SGLANG)
    script = tmp_path / "launch.py"
    script.write_text(text)
    out = tmp_path / "kwargs.json"
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "PYTHONPATH")}
    env.update({"PYTHONPATH": str(fake), "KWARGS_OUT": str(out), **(extra_env or {})})
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    received = json.loads(out.read_text())
    assert isinstance(received, dict)
    return received


# --- argv <-> kwargs -----------------------------------------------------------------------------


@pytest.mark.parametrize("model_path", MODEL_PATHS)
@pytest.mark.parametrize(
    "params", [PARAMS, {}, {"num_speculative_tokens": 2, "draft_model": "ngram", "memory_fraction": 0.2}]
)
def test_kwargs_round_trip_of_sglang_argv(model_path: str, params: dict[str, Any]) -> None:
    args = _sglang_args(model_path, params)
    kwargs = argv_to_kwargs(args)
    assert kwargs["model_path"] == model_path
    assert kwargs_to_argv(kwargs) == args


def test_kwargs_are_typed_like_server_args() -> None:
    kwargs = argv_to_kwargs(_sglang_args("/models/target", PARAMS))
    assert kwargs["enable_metrics"] is True
    assert kwargs["context_length"] == 2048 and type(kwargs["context_length"]) is int
    assert kwargs["chunked_prefill_size"] == 1024 and type(kwargs["chunked_prefill_size"]) is int
    assert kwargs["max_running_requests"] == 8
    assert kwargs["mem_fraction_static"] == pytest.approx(0.85) and type(kwargs["mem_fraction_static"]) is float
    assert kwargs["speculative_algorithm"] == "STANDALONE"
    assert kwargs["speculative_num_steps"] == 3 and kwargs["speculative_num_draft_tokens"] == 4
    assert kwargs["speculative_draft_model_path"] == "/models/target/../draft two"
    assert all("-" not in key for key in kwargs)


@pytest.mark.parametrize(
    "args",
    [
        ["--chunked-prefill-size", "-1", "--enable-metrics"],
        ["--enable-metrics", "--mem-fraction-static", "0.85", "--disable-radix-cache"],
        ["--model-path", "", "--tp-size", "2"],
        ["--model-path", '"; touch pwned; "', "--served-model-name", "a b 'c'"],
        ["--mem-fraction-static", "1e-05", "--schedule-policy", "lpm"],
    ],
)
def test_round_trip_of_hand_written_argv(args: list[str]) -> None:
    assert kwargs_to_argv(argv_to_kwargs(args)) == args


def test_values_become_numbers_bools_or_strings() -> None:
    kwargs = argv_to_kwargs(["--a", "-1", "--b", "0.85", "--c", "STANDALONE", "--d", "--e", "3"])
    assert kwargs == {"a": -1, "b": 0.85, "c": "STANDALONE", "d": True, "e": 3}
    assert [type(v) for v in kwargs.values()] == [int, float, str, bool, int]


@pytest.mark.parametrize("args", [["model", "--x"], ["--a", "1", "2"], ["-m", "sglang.launch_server"]])
def test_argv_that_is_not_flags_is_refused(args: list[str]) -> None:
    with pytest.raises(ExportError):
        argv_to_kwargs(args)


# --- render_python / read_python -----------------------------------------------------------------


@pytest.mark.parametrize("model_path", MODEL_PATHS)
def test_rendered_file_compiles_and_reads_back(model_path: str) -> None:
    m = _manifest(model_path, PARAMS)
    text = render_python(m, provenance(m))
    compile(text, "x.py", "exec")
    assert read_python(text) == m["argv"]
    assert "--host" not in m["argv"] and "--port" not in m["argv"]


@pytest.mark.parametrize("model_path", [INJECTION, CODE_IN_NEWLINES, "/models/a b'c\"d"])
def test_running_the_file_starts_runtime_with_the_manifest_argv(tmp_path: Path, model_path: str) -> None:
    m = _manifest(model_path, PARAMS)
    received = _run_launcher(tmp_path, render_python(m, provenance(m)))
    assert received.pop("host") == "127.0.0.1"
    assert received.pop("port") == 30000
    assert received == argv_to_kwargs(m["argv"])
    assert kwargs_to_argv(received) == m["argv"]
    assert received["model_path"] == model_path
    assert not (tmp_path / "pwned").exists()


def test_host_and_port_come_from_the_environment(tmp_path: Path) -> None:
    m = _manifest("/models/target", {"max_num_seqs": 2})
    received = _run_launcher(tmp_path, render_python(m, provenance(m)), {"HOST": "0.0.0.0", "PORT": "9123"})
    assert received["host"] == "0.0.0.0" and received["port"] == 9123


def _top_level_shape(text: str) -> list[str]:
    """The module's top-level statements, each named by what it is."""
    shape = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Import):
            shape.append("import " + ",".join(alias.name for alias in node.names))
        elif isinstance(node, ast.Assign):
            shape.append("assign " + ",".join(t.id if isinstance(t, ast.Name) else "?" for t in node.targets))
        elif isinstance(node, ast.If):
            shape.append("if " + ast.unparse(node.test))
        else:
            shape.append(type(node).__name__)
    return shape


EXPECTED_SHAPE = ["import os", "import signal", "import sglang", "assign KWARGS", "if __name__ == '__main__'"]


def test_plain_launcher_shape() -> None:
    m = _manifest("/models/target", PARAMS)
    assert _top_level_shape(render_python(m, provenance(m))) == EXPECTED_SHAPE


def _check_no_injection(tmp_path: Path, m: dict[str, Any]) -> None:
    header = provenance(m)
    assert all(line.startswith("# ") and "\n" not in line and "\r" not in line for line in header)
    text = render_python(m, header)
    compile(text, "x.py", "exec")
    assert _top_level_shape(text) == EXPECTED_SHAPE
    assert read_python(text) == m["argv"]
    _run_launcher(tmp_path, text)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "payload",
    [
        "\nimport os; os.system('touch pwned')\n",
        "\rimport os; os.system('touch pwned')\r",
        "\r\nKWARGS = {'model_path': 'evil'}\r\n",
        "\x0cimport os\x0b; os.system('touch pwned')\x85",
        "\u2028import os; os.system('touch pwned')\u2029",
    ],
)
def test_a_line_break_in_the_model_path_cannot_inject_code(tmp_path: Path, payload: str) -> None:
    model_path = "/models/target" + payload
    m = _manifest(model_path, PARAMS)
    assert m["model"] == model_path
    _check_no_injection(tmp_path, m)


@pytest.mark.parametrize(
    "where", ["study", "hardware", "workload", "workload_digest", "engine_version", "config_kind", "distribution"]
)
def test_a_newline_in_any_header_value_cannot_inject_code(tmp_path: Path, where: str) -> None:
    payload = "\nimport os; os.system('touch pwned')\n"
    m = _manifest("/models/target", PARAMS)
    if where == "hardware":
        m["hardware"] = {**m["hardware"], "name": "H200" + payload}
    else:
        m[where] = str(m[where]) + payload
    _check_no_injection(tmp_path, m)


def test_provenance_keeps_every_value_on_its_comment_line() -> None:
    payload = "\nimport os; os.system('touch pwned')\r\n"
    m = _manifest("/models/target" + payload, PARAMS, study_name="s" + payload)
    header = provenance(m)
    assert all(line.startswith("# ") for line in header)
    assert not any(c in line for line in header for c in "\n\r\x0b\x0c\x85\u2028\u2029")
    assert any("import os; os.system('touch pwned')" in line for line in header), "the value is kept, inert"


def test_read_python_without_kwargs_is_refused() -> None:
    with pytest.raises(ExportError, match="KWARGS"):
        read_python("import sglang\nruntime = sglang.Runtime(model_path='/m')\n")


@pytest.mark.parametrize(
    "text",
    [
        "KWARGS = ['--model-path', '/m']\n",  # not a dict
        "OTHER = {'model_path': '/m'}\n",
        "def f():\n    KWARGS = {'model_path': '/m'}\n",  # not at the top level
        "",
    ],
)
def test_read_python_needs_a_top_level_kwargs_dict(text: str) -> None:
    with pytest.raises(ExportError):
        read_python(text)


def test_read_python_of_a_file_that_is_not_python() -> None:
    with pytest.raises(ExportError):
        read_python("#!/usr/bin/env bash\nexec python3 -m sglang.launch_server --model-path /m\n")


def test_read_python_of_a_kwargs_that_is_not_a_literal() -> None:
    with pytest.raises(ExportError):
        read_python("MODEL = '/m'\nKWARGS = {'model_path': MODEL}\n")
