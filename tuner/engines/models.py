"""The embedded default models, generated once into a cache, and user-given models.

With no ``--model``, the tuner generates a small Llama-architecture target and two drafts that
share its tokenizer (see ``tuner/engines/scripts/make_models.py`` for why they agree). Generation runs in
the engine environment's Python, which has torch and transformers; the tuner never imports them.
The cache key hashes the generator and the corpus, so a changed recipe makes new models.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from tuner.engines.base import ModelSpec
from tuner.errors import ConfigError, EnvironmentSetupError

SCRIPTS = Path(__file__).parent / "scripts"  # run by each engine's own Python, never imported
GENERATOR = SCRIPTS / "make_models.py"
CORPUS = Path(__file__).parent.parent / "workloads" / "corpus.txt"
DRAFT_NAMES = ("draft-2l", "draft-1l")


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE", Path.home() / ".cache" / "tuner"))


def _recipe_key() -> str:
    digest = hashlib.sha256(GENERATOR.read_bytes() + CORPUS.read_bytes())
    return digest.hexdigest()[:16]


def default_model_paths(max_model_len: int) -> ModelSpec:
    """Where the default target and drafts are (or will be once generated)."""
    root = cache_dir() / "models" / _recipe_key()
    drafts = {name: str(root / name) for name in DRAFT_NAMES}
    return ModelSpec(path=str(root / "target"), drafts=drafts, max_model_len=max_model_len)


def default_models(engine_python: str, max_model_len: int) -> ModelSpec:
    """Generate (once) and return the default target and drafts."""
    root = cache_dir() / "models" / _recipe_key()
    if not (root / "DONE").exists():
        staging = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            subprocess.run(
                [engine_python, str(GENERATOR), str(CORPUS), str(staging)],
                check=True,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or ""
            raise EnvironmentSetupError(f"generating the default models failed: {exc} {detail[-500:]}") from exc
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)  # atomic: a half-written model folder is never used
    return default_model_paths(max_model_len)


def user_models(model: str, drafts: list[str], max_model_len: int, load_format: str | None = None) -> ModelSpec:
    """A model folder the user gave, with drafts named after their folders."""
    config = Path(model) / "config.json"
    if not config.exists():
        raise ConfigError(f"--model {model}: no config.json there")
    context = json.loads(config.read_text()).get("max_position_embeddings", max_model_len)
    named = {Path(d).name: d for d in drafts}
    for path in named.values():
        if not (Path(path) / "config.json").exists():
            raise ConfigError(f"--draft-model {path}: no config.json there")
    return ModelSpec(model, named, min(max_model_len, int(context)), load_format)
