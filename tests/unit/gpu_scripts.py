"""The GPU block's Python scripts (scripts/gpu/*.py), loaded as modules for their tests: they are run by
path on the device and here, not installed with the package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

GPU_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "gpu"


def load_gpu_script(name: str) -> ModuleType:
    """scripts/gpu/``name``.py as a module of that name, importing its siblings as it does when run by
    path (plan_block.py imports carry_check.py)."""
    if str(GPU_SCRIPTS) not in sys.path:
        sys.path.append(str(GPU_SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, GPU_SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of the script finds its module there
    spec.loader.exec_module(module)
    return module
