"""``tuner drive`` through the real CLI against a small OpenAI-compatible server on loopback.

The server (``http.server`` in a thread) answers ``/v1/models`` with the card the test gives and
streams one-token completions, failing the requests the test picks with vLLM's error body. Every
case runs with no engine environment and no search space: ``drive`` needs neither.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.search.drive_server import served_model

NOT_FOUND = "The model `gone` does not exist."


@dataclass
class Fake:
    """What the server says, and what it saw."""

    card: dict[str, Any]
    fails: Callable[[int], bool] = lambda n: False  # by the completion's number, from 0
    completions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [fake.card]}).encode())
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            with fake.lock:
                number, fake.completions = fake.completions, fake.completions + 1
            if fake.fails(number):
                error = {"object": "error", "message": NOT_FOUND, "type": "NotFoundError", "code": 404}
                self._send(404, json.dumps(error).encode())
                return
            chunk = {"choices": [{"index": 0, "text": " hi"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
            self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")

    return Handler


@contextlib.contextmanager
def serving(fake: Fake) -> Iterator[str]:
    with loopback.serving(_handler(fake)) as url:
        yield url


@pytest.fixture(autouse=True)
def no_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine environment exists and no default model was generated: drive needs neither."""
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(tmp_path / "no-engines"))
    monkeypatch.setenv("TUNER_CACHE", str(tmp_path / "no-cache"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def folder(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    model = tmp_path / "served-model"
    model.mkdir()
    tokenizer.save(str(model / "tokenizer.json"))
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "model_type": "llama"}))
    return model


def cli(args: list[str]) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    # rag's one line saying it scaled to the served context is not an error: left out of what is checked
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    return code, out.getvalue(), [line for line in lines if "is shorter than the preset needs" not in line]


def drive(url: str, *extra: str) -> list[str]:
    return ["drive", "--url", url, "--workload", "rag", "--requests", "5", "--concurrency", "1", "--json", *extra]


def _no_nan(name: str) -> None:
    raise AssertionError(f"{name} in the JSON")


def test_the_served_folder_sizes_the_prompts_and_undefined_figures_are_null(folder: Path) -> None:
    fake = Fake({"id": str(folder), "root": str(folder), "max_model_len": 1536})
    with serving(fake) as url:
        code, out, err = cli(drive(url))
    assert code == 0 and not err, err
    report = json.loads(out, parse_constant=_no_nan)
    assert report["model"] == str(folder) and report["tokenizer"] == str(folder)
    assert report["max_model_len"] == 1536  # the server's, not the config's 4096
    assert report["metrics"]["error_rate"] == 0.0 and report["metrics"]["n_requests"] == 5
    assert report["metrics"]["tpot_p95_ms"] is None  # one token per request: no TPOT
    assert fake.completions == 2 + 5  # the warmup pass, then the measured requests


def test_a_served_name_with_its_folder_as_root_is_served_by_name(folder: Path) -> None:
    fake = Fake({"id": "my-model", "root": str(folder)})  # --served-model-name; no max_model_len
    with serving(fake) as url:
        code, out, _ = cli(drive(url))
    report = json.loads(out)
    assert code == 0 and report["model"] == "my-model" and report["tokenizer"] == str(folder)
    assert report["max_model_len"] == 4096  # from the folder's config.json


def test_a_served_name_that_is_no_folder_here_asks_for_model(folder: Path) -> None:
    with serving(Fake({"id": "meta-llama/Llama-3.1-8B", "max_model_len": 8192})) as url:
        code, out, err = cli(drive(url))
        assert code == 2 and not out and len(err) == 1
        assert "'meta-llama/Llama-3.1-8B'" in err[0] and "cannot size the prompts exactly" in err[0]
        assert "--model" in err[0]
        code, out, err = cli(drive(url, "--model", str(folder)))
    report = json.loads(out)
    assert code == 0 and report["tokenizer"] == str(folder) and report["max_model_len"] == 8192


def test_a_server_failing_the_first_requests_stops_the_drive_at_once(folder: Path) -> None:
    fake = Fake({"id": str(folder)}, fails=lambda n: True)
    with serving(fake) as url:
        code, out, err = cli(drive(url, "--requests", "40"))
    assert code == 1 and not out and len(err) == 1, err
    assert "8 of the first 8 requests failed" in err[0] and f"HTTP 404: {NOT_FOUND}" in err[0]
    assert fake.completions == 8  # one at a time, so the eighth failure was the last request sent


def test_requests_failed_beyond_the_limit_exit_1_after_the_report(folder: Path) -> None:
    fake = Fake({"id": str(folder)}, fails=lambda n: n == 4)  # one measured request of five
    with serving(fake) as url:
        code, out, err = cli(drive(url))
    report = json.loads(out)
    assert code == 1 and report["metrics"]["n_errors"] == 1 and len(err) == 1
    assert "1 of 5 requests failed (20.0%, above the 0.5%" in err[0] and NOT_FOUND in err[0]
    assert report["first_error"] == f"HTTP 404: {NOT_FOUND}"


def test_the_table_says_n_a_for_an_undefined_figure(folder: Path) -> None:
    with serving(Fake({"id": str(folder)})) as url:
        code, out, _ = cli(drive(url)[:-1])  # without --json
    tpot = next(line for line in out.splitlines() if "tpot_p95_ms" in line)
    assert code == 0 and tpot.split() == ["tpot_p95_ms", "n/a"]


def test_drive_takes_no_search_space(folder: Path) -> None:
    code, _, err = cli(drive("http://127.0.0.1:1", "--space", "space.yaml"))
    assert code == 2 and "unrecognized arguments: --space" in err[0]


@pytest.mark.parametrize(
    ("respond", "says"),
    [
        (lambda r: httpx.Response(500, text="oops"), "JSONDecodeError"),
        (lambda r: httpx.Response(200, json={"data": []}), "IndexError"),
        (lambda r: httpx.Response(200, json={"data": [{"object": "model"}]}), "KeyError"),
        (lambda r: httpx.Response(200, json=[1]), "TypeError"),
    ],
)
def test_no_models_list_is_a_config_error(respond: Callable[[httpx.Request], httpx.Response], says: str) -> None:
    with httpx.Client(transport=httpx.MockTransport(respond)) as client, pytest.raises(ConfigError) as raised:
        served_model(client, "http://server.test")
    assert str(raised.value) == f"--url http://server.test: no OpenAI-compatible /v1/models there ({says})"


def test_a_card_without_a_usable_length_leaves_the_length_to_the_model() -> None:
    card = {"id": "m", "max_model_len": "long"}
    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"data": [card]}))) as c:
        served = served_model(c, "http://server.test")
    assert served.name == "m" and served.folder is None and served.max_model_len is None
