"""Failure classification on the logs of the first H200 study (reports/gpu-h200.md), and the study
file itself: the CUDA out-of-memory caused on purpose is ``oom_boot`` and the study went on.

The captures are whole trial logs of ``tuner search`` (tests/data/captures/README.md); they are named
``trial-*`` so that test_failures.py's ``fail_*`` / ``boot_ok_*`` inventories are not changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.study_files import H200_FIRST, recorded_attrs
from tuner.engines import ADAPTERS
from tuner.engines.base import EngineAdapter
from tuner.measure.failures import OOM_CLASSES, classify_boot, classify_serve, match_signature
from tuner.measure.process import tail

ROOT = Path(__file__).resolve().parents[3]
VLLM = ROOT / "tests" / "data" / "captures" / "vllm-0.26.0-h200-2026-12-01"
SGLANG = ROOT / "tests" / "data" / "captures" / "sglang-0.5.17-h200-2026-12-01"

OOM_LOG = VLLM / "trial-0002-vllm-oom-60GiB-held-util-0.95.log"
REJECTED_LOG = VLLM / "trial-0006-vllm-chunk512-draft-k4-rejected.log"
SERVED = {
    VLLM / "trial-0000-vllm-defaults-served.log": "INFO:     Application startup complete.",
    VLLM / "trial-0010-vllm-ngram-k5-served.log": "INFO:     Application startup complete.",
    SGLANG / "trial-0001-sglang-defaults-served.log": "The server is fired up and ready to roll!",
    SGLANG / "trial-0007-sglang-standalone-k2-served.log": "The server is fired up and ready to roll!",
}


def _adapter(path: Path) -> EngineAdapter:
    return ADAPTERS[path.parent.name.split("-")[0]]()


def _failures() -> dict[int, str | None]:
    """Each trial's stored ``failure`` user attribute."""
    return {n: a["failure"] for n, a in sorted(recorded_attrs(H200_FIRST).items()) if "failure" in a}


def test_oom_log_holds_vllms_startup_memory_check() -> None:
    text = OOM_LOG.read_text()
    assert "Free memory on device cuda:0 (78.77/139.8 GiB) on startup is less than desired" in text
    assert "(0.95, 132.81 GiB)" in text


def test_oom_on_a_shared_gpu_is_oom_boot_from_the_whole_log_and_from_its_tail() -> None:
    assert match_signature(OOM_LOG.read_text(), ADAPTERS["vllm"]()) == "oom_boot"
    # what ServerProcess._fail classifies: the last 400 lines, exit status 1
    assert classify_boot(tail(OOM_LOG, max_lines=400), 1, False, ADAPTERS["vllm"]()) == "oom_boot"


def test_the_study_recorded_oom_boot_and_went_on() -> None:
    failures = _failures()
    assert failures[2] == "oom_boot"
    later = [n for n in failures if n > 2]
    assert len(later) >= 5, "trials ran after the out-of-memory one"
    assert sum(failures[n] is None for n in later) >= 5, "and served"


def test_holder_log_shows_the_memory_held_during_the_boot() -> None:
    text = (VLLM / "oom-holder-trial-0002.log").read_text()
    assert "holding 60.0 GiB; free 79.29 of 139.80 GiB" in text
    assert text.index("holding") < text.index("is less than desired GPU memory utilization") < text.index("released")


@pytest.mark.parametrize("path", sorted(SERVED), ids=lambda p: p.name)
def test_served_boot_logs_match_no_failure_signature(path: Path) -> None:
    """A boot that served must not look like a failure (vLLM's ulimit warning and SGLang's
    torchao warnings included)."""
    text = path.read_text()
    assert SERVED[path] in text
    assert match_signature(text, _adapter(path)) is None


@pytest.mark.parametrize("path", sorted(SERVED), ids=lambda p: p.name)
def test_served_logs_after_ready(path: Path) -> None:
    """classify_serve on what the log holds after the ready line: fine while alive, a crash (not
    an out-of-memory) if the server had died, request errors above the bound."""
    text = path.read_text()
    since_ready, adapter = text[text.index(SERVED[path]) :], _adapter(path)
    assert classify_serve(since_ready, alive=True, error_rate=0.0, max_error_rate=0.005, adapter=adapter) is None
    assert classify_serve(since_ready, False, 0.0, 0.005, adapter) == "crash_on_request"
    assert classify_serve(since_ready, True, 0.5, 0.005, adapter) == "request_errors"


def test_oom_text_after_ready_makes_a_death_oom_load() -> None:
    """The same out-of-memory text appended after a served boot: a server that then died is oom_load."""
    served = (VLLM / "trial-0000-vllm-defaults-served.log").read_text()
    oom_lines = [ln for ln in OOM_LOG.read_text().splitlines() if "is less than desired" in ln]
    assert oom_lines
    vllm = ADAPTERS["vllm"]()
    assert match_signature(oom_lines[0], vllm) in OOM_CLASSES
    assert classify_serve(served + "\n" + oom_lines[0], False, 1.0, 0.005, vllm) == "oom_load"


def test_rejected_speculative_config_log_is_vllms_validation_error() -> None:
    text = REJECTED_LOG.read_text()
    assert "max_num_scheduled_tokens is set to 0 based on the speculative decoding settings" in text
    assert "'max_num_batched_tokens': 512" in text and "'num_speculative_tokens': 4" in text
    assert _failures()[6] == "engine_died"  # what the study recorded, before this signature was known


def test_rejected_speculative_config_should_be_invalid_config() -> None:
    assert classify_boot(tail(REJECTED_LOG, max_lines=400), 1, False, ADAPTERS["vllm"]()) == "invalid_config"
