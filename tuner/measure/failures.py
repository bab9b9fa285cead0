"""Classify why a trial failed, from exit status, signals, health and log text.

Classes (stored on the trial as the ``failure`` user attribute; ``None`` means it served):

=================== =====================================================================
``invalid_config``  the engine rejected the command: its argument parser (exit 2, ``usage:``), or
                    its validation or a known death at boot (the adapter's signatures)
``kv_insufficient`` the weights fit but the KV cache is too small for the max model length
``oom_boot``        out of memory while loading or reserving memory at boot
``boot_timeout``    not ready before the deadline
``engine_died``     exited during boot with no known signature, or died later while idle
``crash_on_request`` died while serving, with no out-of-memory signature
``oom_load``        died while serving, with an out-of-memory signature
``request_errors``  stayed up but more than the allowed share of requests failed
``port_in_use``     its port was taken before it bound it, on the first boot and on the one
                    retry on a fresh port (``tuner.measure.process``): the machine's fault, not the config's
=================== =====================================================================

Signatures are the engines' own messages, each held by its adapter (``EngineAdapter.failure_signatures``,
read from ../shared/reference/engines.md and the real logs in tests/data/captures), then the ones
any engine's log may show (``COMMON``: Python's argument parser, torch, the operating system). The
first match wins, so the more specific come first.
"""

from __future__ import annotations

import functools
import re
import signal

from tuner.engines.base import EngineAdapter

OOM_CLASSES = frozenset({"oom_boot", "kv_insufficient", "oom_load"})

# (regex, class) pairs that no engine owns, matched after the engine's own
COMMON: tuple[tuple[str, str], ...] = (
    (r"unrecognized arguments|invalid choice|ambiguous option|^usage: ", "invalid_config"),  # argparse
    (r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError", "oom_boot"),
    # vLLM binds early ("[Errno 98] Address already in use"), SGLang's uvicorn late ("... address already in use")
    (r"(?i)address already in use", "port_in_use"),
)


@functools.cache
def _compiled(signatures: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((re.compile(p, re.MULTILINE), c) for p, c in signatures)


def match_signature(log_text: str, adapter: EngineAdapter | None) -> str | None:
    """The failure class whose signature (``adapter``'s own, then ``COMMON``) appears in ``log_text``,
    or None. Without an adapter (an engine not known) only ``COMMON`` is matched."""
    own = adapter.failure_signatures if adapter is not None else ()
    for pattern, failure in _compiled((*own, *COMMON)):
        if pattern.search(log_text):
            return failure
    return None


def classify_boot(log_text: str, returncode: int | None, timed_out: bool, adapter: EngineAdapter | None) -> str:
    """Why ``adapter``'s server never became ready. ``returncode`` is None while it still runs."""
    if timed_out and returncode is None:
        return "boot_timeout"
    found = match_signature(log_text, adapter)
    if found is not None:
        return found
    if returncode == 2:
        return "invalid_config"
    if returncode == -signal.SIGKILL or returncode == 137:
        return "oom_boot"  # the kernel's OOM killer, or SGLang killing its own tree after an OOM
    return "boot_timeout" if timed_out else "engine_died"


def classify_serve(
    log_since_ready: str, alive: bool, error_rate: float, max_error_rate: float, adapter: EngineAdapter | None
) -> str | None:
    """Why ``adapter``'s server that booted failed its workload, or None when it served within bounds."""
    if not alive:
        found = match_signature(log_since_ready, adapter)
        return "oom_load" if found in OOM_CLASSES else "crash_on_request"
    if error_rate > max_error_rate:
        return "oom_load" if match_signature(log_since_ready, adapter) in OOM_CLASSES else "request_errors"
    return None
