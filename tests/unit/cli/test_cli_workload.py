"""``tuner workload`` and the trace and arrival flags of ``tuner search``, through the real CLI.

Nothing here may start a process (``subprocess.Popen`` fails the test); ``--model`` points at a
folder holding the test tokenizer, so no engine environment is needed.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from tokenizers import Tokenizer

from tuner.cli.main import main
from tuner.workloads.rag import DEFAULT_REUSE


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(tmp_path / "no-engines"))

    def no_process(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"the CLI started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    previous = signal.getsignal(signal.SIGTERM)
    yield folder
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def model(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return folder


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: "), captured.err
    return lines[0]


def test_workload_writes_the_requests_and_shows_their_statistics(
    work: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["workload", "agent", "--seed", "3", "--requests", "12", "--model", str(model), "--out", "a.jsonl"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for label in ("prompt tokens", "appended per turn", "max_tokens", "JSON output", "shared prefix", "SLO"):
        assert label in out
    lines = (work / "a.jsonl").read_text().splitlines()
    assert len(lines) == 12 + 2 and json.loads(lines[0])["warmup"] is True
    first = (work / "a.jsonl").read_bytes()
    assert main([*argv[:-1], "b.jsonl"]) == 0
    assert (work / "b.jsonl").read_bytes() == first  # same seed, same tokenizer: the same bytes


def test_shared_prefix_fraction_follows_the_reuse_share(
    work: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shares = {}
    for reuse in ("0", None, "0.8"):  # None: rag's default share
        flags = [] if reuse is None else ["--prefix-reuse", reuse]
        assert main(["workload", "rag", "--model", str(model), "--requests", "40", *flags, "--out", "r.jsonl"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if "shared prefix" in x)
        shares[reuse] = float(line.split()[2].rstrip("%"))
    # the measured share of 16-token blocks an earlier prompt had: below the share (each document's
    # first reading and the block a prefix ends in are misses), and nothing much without one
    default = 100 * DEFAULT_REUSE
    assert shares["0"] < 5 and default / 2 < shares[None] <= default + 1 and 55 < shares["0.8"] <= 81, shares


def test_workload_replays_a_trace_and_flags_override_arrivals(
    work: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = work / "mine.jsonl"
    trace.write_text(json.dumps({"prompt": "Hello", "max_tokens": 4}) + "\n")
    assert main(["workload", str(trace), "--model", str(model), "--out", "o.jsonl", "--rate", "2"]) == 0
    assert "open loop, 2/s (Poisson)" in capsys.readouterr().out


def test_bad_trace_line_is_exit_2_with_its_line_and_nothing_written(
    work: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = work / "bad.jsonl"
    trace.write_text('{"prompt": "ok", "max_tokens": 4}\n{"prompt": 7}\n')
    assert main(["workload", str(trace), "--model", str(model), "--out", "o.jsonl"]) == 2
    assert "bad.jsonl line 2: prompt must be a non-empty string" in _one_error_line(capsys)
    assert not (work / "o.jsonl").exists()
    assert main(["search", "--workload", str(trace)]) == 2  # refused before any engine is probed
    assert "line 2" in _one_error_line(capsys)
    assert sorted(p.name for p in work.iterdir()) == ["bad.jsonl"]


@pytest.mark.parametrize(
    "flags,named",
    [(["--rate", "0"], "--rate"), (["--burstiness", "-1"], "--burstiness"), (["--requests", "0"], "--requests")],
)
def test_bad_arrival_flags_are_exit_2(
    work: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    assert main(["search", "--workload", "chat", *flags]) == 2
    assert named in _one_error_line(capsys)


def test_unknown_workload_and_missing_trace(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--workload", "poetry"]) == 2
    assert "known workloads: rag, agent, chat, json" in _one_error_line(capsys)
    assert main(["search", "--workload", "missing.jsonl"]) == 2
    assert "no such trace file" in _one_error_line(capsys)


def test_burstiness_needs_an_open_loop(work: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", "rag", "--model", str(model), "--out", "o.jsonl", "--burstiness", "2"]) == 2
    assert "give --rate too" in _one_error_line(capsys)
