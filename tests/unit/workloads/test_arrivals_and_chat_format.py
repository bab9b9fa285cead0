"""Seeded open-loop release times, the arrival flags, and the chat template rendered in Python."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.workloads.arrivals import Arrival, override, release_times
from tuner.workloads.chat_format import check_template, is_generated_template, render_chat, render_follow_up

MAKE_MODELS = Path(__file__).resolve().parents[3] / "tuner" / "engines" / "scripts" / "make_models.py"


def _gaps(times: list[float | None]) -> list[float]:
    values = [t for t in times if t is not None]
    return [b - a for a, b in zip(values, values[1:], strict=False)]


def test_release_times_are_seeded_and_take_n_over_rate() -> None:
    poisson = Arrival(rate=4.0, concurrency=None)
    times = release_times(400, poisson, seed=1)
    assert times == release_times(400, poisson, seed=1) and times != release_times(400, poisson, seed=2)
    assert times[0] == 0.0 and all(g >= 0 for g in _gaps(times))
    assert statistics.mean(_gaps(times)) == pytest.approx(0.25, rel=0.05)  # rescaled: N releases in N / rate
    assert release_times(3, Arrival(concurrency=4), seed=1) == [None, None, None]


def test_burstiness_shapes_the_gaps() -> None:
    def spread(burstiness: float) -> float:
        gaps = _gaps(release_times(2000, Arrival(rate=2.0, burstiness=burstiness), seed=3))
        return statistics.stdev(gaps) / statistics.mean(gaps)

    assert spread(1.0) == pytest.approx(1.0, abs=0.1)  # Poisson: exponential gaps
    assert spread(0.25) > 1.6 > spread(1.0) > 0.6 > spread(4.0)


def test_flags_override_the_preset_pattern() -> None:
    closed, opened = Arrival(concurrency=4), Arrival(rate=0.5, burstiness=0.5, concurrency=None)
    assert override(closed) == closed
    assert override(closed, rate=3.0) == Arrival(rate=3.0, burstiness=1.0, concurrency=None)
    assert override(opened, rate=3.0) == Arrival(rate=3.0, burstiness=0.5, concurrency=None)
    assert override(opened, rate=3.0, concurrency=8) == Arrival(rate=3.0, burstiness=0.5, concurrency=8)
    assert override(opened, concurrency=2) == Arrival(concurrency=2)
    assert override(opened, burstiness=2.0) == Arrival(rate=0.5, burstiness=2.0, concurrency=None)
    with pytest.raises(ConfigError, match="give --rate too"):
        override(closed, burstiness=2.0)
    with pytest.raises(ConfigError, match="give --rate too"):
        override(opened, concurrency=2, burstiness=2.0)
    with pytest.raises(ConfigError, match="--rate"):
        override(closed, rate=float("nan"))


def test_render_chat_is_the_generated_template() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_chat(messages) == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    follow_up = render_follow_up([{"role": "user", "content": "More"}])
    history = messages + [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    assert render_chat(messages) + "Hello" + follow_up == render_chat(history)  # a turn extends the text


def _generated_template() -> str:
    for node in ast.parse(MAKE_MODELS.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CHAT_TEMPLATE":
            return str(ast.literal_eval(node.value))
    raise AssertionError("make_models.py lost its CHAT_TEMPLATE")


def test_the_generated_models_template_is_recognised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    template = _generated_template()
    assert is_generated_template(template)
    (tmp_path / "chat_template.jinja").write_text(template)
    check_template(tmp_path, "chat")
    assert capsys.readouterr().err == ""
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    check_template(tmp_path, "chat")
    assert "has its own chat template" in capsys.readouterr().err
