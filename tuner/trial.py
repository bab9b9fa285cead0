"""One trial end to end: boot the engine, warm up, drive the workload, score, stop.

Every path out of ``run_trial`` stops the server's whole process group (``ServerProcess``), and a
failure becomes a ``TrialResult`` with a failure class rather than an exception: the study goes on.
The serving phases are in ``tuner.serving``; the types in ``tuner.outcome``.
"""

from __future__ import annotations

from dataclasses import replace

from tuner.engines.base import Config
from tuner.errors import EngineLaunchError
from tuner.memory_facts import parse_facts
from tuner.outcome import MAX_ERROR_RATE, TrialContext, TrialResult, WatchFactory
from tuner.process import ServerProcess, free_port, head, tail
from tuner.serving import serve_workload, stress_run
from tuner.telemetry import MemorySampler

__all__ = ["MAX_ERROR_RATE", "TrialContext", "TrialResult", "run_trial"]


def run_trial(
    number: int,
    config: Config,
    ctx: TrialContext,
    repeat: int | None = None,
    stress: bool = False,
    watch: WatchFactory | None = None,
) -> TrialResult:
    """Run one config once; ``repeat`` numbers a finalist's fresh-boot repeat (its own log file);
    ``stress`` adds the stress run (``tuner.stress``) on the same server once the workload served;
    ``watch`` lets a pruner stop the workload early (the result then carries ``pruned``)."""
    adapter, env = ctx.engines[config.engine]
    spec = adapter.launch(config, ctx.model, ctx.device, free_port(), env.python, env.version)
    if ctx.gpus is not None:  # this slot's GPUs only: parallel trials never share one
        spec = replace(spec, env={**spec.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, ctx.gpus))})
    suffix = "" if repeat is None else f"-repeat{repeat}"
    log_path = ctx.log_dir / f"trial-{number:04d}-{config.engine}{suffix}.log"
    result = TrialResult(config=config, launch=spec, engine_version=env.version, log_path=str(log_path))
    ctx.progress.phase(number, "boot", _describe(config))
    with ServerProcess(spec, log_path) as server, MemorySampler(ctx.device.kind, server.pid, ctx.gpus) as memory:
        try:
            result.boot_s = server.wait_ready(ctx.boot_deadline_s)
        except EngineLaunchError as exc:
            result.failure, result.log_tail = exc.failure, exc.log_tail
            ctx.progress.phase(number, "failed", f"{exc.failure} at boot")
        else:
            result.launch = server.spec  # the argv that booted (a boot retried on a fresh port has another)
            result.phases_s["boot"] = round(result.boot_s, 2)
            serve_workload(number, server, adapter, ctx, result, watch)
            if stress and result.failure is None and result.pruned is None:
                stress_run(number, server, adapter, ctx, result)
            result.log_tail = tail(log_path)
    result.peak_memory_bytes = memory.peak_bytes
    result.engine_gpu_peak_bytes = memory.engine_peak_bytes
    result.memory_facts = parse_facts(head(log_path))
    return result


def _describe(config: Config) -> str:
    if config.is_default:
        return f"{config.engine} engine defaults"
    return config.engine + " " + " ".join(f"{k}={v}" for k, v in config.params.items())
