"""Failure classification on real engine logs (tests/data/captures) and on exit status alone."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tuner.engines import ADAPTERS
from tuner.engines.base import EngineAdapter
from tuner.measure.failures import OOM_CLASSES, classify_boot, classify_serve, match_signature
from tuner.measure.process import tail

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"

# The class each real failure log must get, and the exit status the engine had (see captures/README.md).
EXPECTED_FAILURES: dict[str, tuple[str, int]] = {
    # "ValueError: No available memory for the cache blocks", exit 1
    "vllm-0.26-h200/fail_kv_no_memory_util_0.10.log": ("kv_insufficient", 1),
    # "Free memory on device cuda:0 (78.77/139.8 GiB) on startup is less than desired GPU memory utilization", exit 1
    "vllm-0.26-h200/fail_free_memory_below_util_shared_gpu.log": ("oom_boot", 1),
    # "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.1", exit 137
    "sglang-0.5.17-h200/fail_mem_fraction_0.1_exit137.log": ("kv_insufficient", 137),
    # "0.03 GiB KV cache is needed, which is larger than the available KV cache memory (0.02 GiB)", exit 1
    "vllm-0.32-cpu/fail_kv_cache_needed_kv_bytes_26843545.log": ("kv_insufficient", 1),
}


def _read(rel: str) -> str:
    return (CAPTURES / rel).read_text(encoding="utf-8")


def _adapter(rel: str) -> EngineAdapter:
    """The adapter of the engine whose log a capture is: its folder is named after the engine."""
    return ADAPTERS[rel.split("-")[0]]()


VLLM = ADAPTERS["vllm"]()
SGLANG = ADAPTERS["sglang"]()


def _rel(path: Path) -> str:
    return path.relative_to(CAPTURES).as_posix()


def test_every_failure_capture_has_an_expected_class() -> None:
    found = sorted(_rel(p) for p in CAPTURES.glob("*/fail_*.log"))
    assert found == sorted(EXPECTED_FAILURES), "a new fail_*.log needs its expected class here"


def test_there_are_success_captures_for_each_engine_folder() -> None:
    folders = {p.parent.name for p in CAPTURES.glob("*/boot_ok_*.log")}
    assert folders == {"vllm-0.26-h200", "sglang-0.5.17-h200", "vllm-0.32-cpu"}


@pytest.mark.parametrize("rel", sorted(EXPECTED_FAILURES))
def test_real_failure_log_signature(rel: str) -> None:
    expected, _ = EXPECTED_FAILURES[rel]
    assert match_signature(_read(rel), _adapter(rel)) == expected


@pytest.mark.parametrize("rel", sorted(EXPECTED_FAILURES))
def test_real_failure_log_with_its_exit_status(rel: str) -> None:
    expected, returncode = EXPECTED_FAILURES[rel]
    assert classify_boot(_read(rel), returncode, timed_out=False, adapter=_adapter(rel)) == expected


@pytest.mark.parametrize("rel", sorted(EXPECTED_FAILURES))
def test_an_engines_log_lines_are_its_own_adapters(rel: str) -> None:
    """The signatures live in each adapter: another engine's adapter knows none of these lines, and
    classifies the failure by its exit status alone."""
    other = next(ADAPTERS[name]() for name in ADAPTERS if name != _adapter(rel).name)
    assert match_signature(_read(rel), other) is None
    assert match_signature(_read(rel), None) is None


@pytest.mark.parametrize("rel", sorted(EXPECTED_FAILURES))
def test_real_failure_log_tail_is_enough(rel: str) -> None:
    """A failed boot is classified from the log's last 400 lines (``ServerProcess._fail``), not the whole file."""
    expected, returncode = EXPECTED_FAILURES[rel]
    assert classify_boot(tail(CAPTURES / rel, max_lines=400), returncode, False, _adapter(rel)) == expected


@pytest.mark.parametrize("path", sorted(CAPTURES.glob("*/boot_ok_*.log")), ids=_rel)
def test_successful_boot_logs_match_no_signature(path: Path) -> None:
    assert match_signature(path.read_text(encoding="utf-8"), _adapter(_rel(path))) is None


@pytest.mark.parametrize("path", sorted(CAPTURES.glob("*/boot_ok_*.log")), ids=_rel)
def test_successful_boot_log_then_exit_is_engine_died(path: Path) -> None:
    assert classify_boot(path.read_text(encoding="utf-8"), 1, False, _adapter(_rel(path))) == "engine_died"


def test_sglang_newer_phrasing_is_an_out_of_memory_class() -> None:
    # SGLang 0.5.23's phrasing of the same failure (captures/README.md)
    text = "ValueError: Not enough memory. Please try to increase --mem-fraction-static."
    assert match_signature(text, SGLANG) in OOM_CLASSES


# --- classify_boot on exit status ----------------------------------------------------------------


def test_boot_timeout_while_still_running() -> None:
    assert classify_boot("", None, timed_out=True, adapter=VLLM) == "boot_timeout"
    assert classify_boot("INFO loading weights\n", None, timed_out=True, adapter=VLLM) == "boot_timeout"


def test_boot_timeout_while_running_wins_over_log_text() -> None:
    """A server still running at the deadline is a timeout, whatever its log has said so far."""
    text = _read("vllm-0.26-h200/fail_kv_no_memory_util_0.10.log")
    assert classify_boot(text, None, timed_out=True, adapter=VLLM) == "boot_timeout"


def test_argument_parser_rejection_is_invalid_config() -> None:
    text = (
        "usage: api_server.py [-h] [--host HOST] [--port PORT]\n"
        "api_server.py: error: unrecognized arguments: --num-speculative-tokens 3\n"
    )
    assert classify_boot(text, 2, timed_out=False, adapter=VLLM) == "invalid_config"


def test_invalid_choice_is_invalid_config() -> None:
    text = "api_server.py: error: argument --load-format: invalid choice: 'dumb' (choose from 'auto', 'dummy')\n"
    assert classify_boot(text, 2, timed_out=False, adapter=VLLM) == "invalid_config"


def test_exit_two_without_text_is_invalid_config() -> None:
    assert classify_boot("", 2, timed_out=False, adapter=VLLM) == "invalid_config"


@pytest.mark.parametrize("returncode", [-signal.SIGKILL, 137])
def test_killed_without_text_is_oom_boot(returncode: int) -> None:
    assert classify_boot("", returncode, timed_out=False, adapter=VLLM) == "oom_boot"


@pytest.mark.parametrize("returncode", [1, -signal.SIGSEGV, 3])
def test_other_exit_without_text_is_engine_died(returncode: int) -> None:
    assert classify_boot("", returncode, timed_out=False, adapter=VLLM) == "engine_died"


def test_usage_must_start_a_line() -> None:
    # a log line that merely mentions "usage: " (e.g. KV cache usage) is not a parser error
    text = "INFO Engine 000: Running: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n"
    assert match_signature(text, VLLM) is None


def test_cuda_out_of_memory_at_boot() -> None:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert classify_boot(text, 1, timed_out=False, adapter=VLLM) == "oom_boot"


# --- classify_serve ------------------------------------------------------------------------------

OOM_TEXT = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.\n"
CRASH_TEXT = "RuntimeError: Unsupported CPU attention configuration: head_dim=16\n"


def test_dead_with_oom_text_is_oom_load() -> None:
    assert classify_serve(OOM_TEXT, alive=False, error_rate=1.0, max_error_rate=0.005, adapter=VLLM) == "oom_load"


def test_dead_with_kv_text_is_oom_load() -> None:
    text = _read("vllm-0.32-cpu/fail_kv_cache_needed_kv_bytes_26843545.log")
    assert classify_serve(text, alive=False, error_rate=0.0, max_error_rate=0.005, adapter=VLLM) == "oom_load"


@pytest.mark.parametrize("text", [CRASH_TEXT, "", "Segmentation fault\n"])
def test_dead_with_other_text_is_crash_on_request(text: str) -> None:
    assert classify_serve(text, alive=False, error_rate=0.5, max_error_rate=0.005, adapter=VLLM) == "crash_on_request"


def test_dead_even_without_errors_is_a_failure() -> None:
    assert (
        classify_serve(CRASH_TEXT, alive=False, error_rate=0.0, max_error_rate=0.005, adapter=VLLM)
        == "crash_on_request"
    )


def test_alive_with_too_many_errors() -> None:
    assert classify_serve("", alive=True, error_rate=0.0625, max_error_rate=0.005, adapter=VLLM) == "request_errors"


def test_alive_with_too_many_errors_and_oom_text() -> None:
    assert classify_serve(OOM_TEXT, alive=True, error_rate=0.25, max_error_rate=0.005, adapter=VLLM) == "oom_load"


@pytest.mark.parametrize("rate", [0.0, 0.004, 0.005])
def test_alive_and_within_bounds_is_none(rate: float) -> None:
    assert classify_serve("INFO: 200 OK\n", alive=True, error_rate=rate, max_error_rate=0.005, adapter=VLLM) is None


def test_alive_and_fine_ignores_harmless_text() -> None:
    text = "\n".join(_read("vllm-0.32-cpu/boot_ok_draft_model_k3.log").splitlines()[-6:])
    assert classify_serve(text, alive=True, error_rate=0.0, max_error_rate=0.005, adapter=VLLM) is None
