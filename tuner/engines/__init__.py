"""Engine adapters by name. Each module holds one adapter behind ``EngineAdapter``."""

from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter

ADAPTERS: dict[str, type[EngineAdapter]] = {"vllm": VllmAdapter, "sglang": SglangAdapter}
DEFAULT_ENGINES = ("vllm",)  # a space that names no engine: the one with a CPU build, so it runs anywhere

__all__ = [
    "ADAPTERS",
    "DEFAULT_ENGINES",
    "Config",
    "Device",
    "EngineAdapter",
    "LaunchSpec",
    "ModelSpec",
    "SglangAdapter",
    "VllmAdapter",
]
