"""The embedded default models, generated once into a cache, and user-given models.

With no ``--model``, the tuner generates a small Llama-architecture target, two drafts that share
its tokenizer (see ``tuner/engines/scripts/make_models.py`` for why they agree) and an EAGLE-3 and an
EAGLE head for it. Generation runs in
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

from tuner.engines.base import SCRIPTS, ModelSpec
from tuner.engines.drafts import check_fits, draft_kind, mtp_layers
from tuner.errors import ConfigError, EnvironmentSetupError

GENERATOR = SCRIPTS / "make_models.py"
CORPUS = Path(__file__).parent.parent / "workloads" / "corpus.txt"
DRAFT_NAMES = ("draft-2l", "draft-1l")
HEADS = {"eagle3-head": "eagle3", "eagle-head": "eagle"}  # the generated heads, by the method each serves


def cache_dir() -> Path:
    return Path(os.environ.get("TUNER_CACHE", Path.home() / ".cache" / "tuner"))


def _recipe_key() -> str:
    digest = hashlib.sha256(GENERATOR.read_bytes() + CORPUS.read_bytes())
    return digest.hexdigest()[:16]


def default_model_paths(max_model_len: int) -> ModelSpec:
    """Where the default target and drafts are (or will be once generated)."""
    root = cache_dir() / "models" / _recipe_key()
    drafts = {name: str(root / name) for name in (*DRAFT_NAMES, *HEADS)}
    return ModelSpec(path=str(root / "target"), drafts=drafts, max_model_len=max_model_len, draft_kinds=dict(HEADS))


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
    """A model folder the user gave, with drafts and heads named after their folders (``--draft-model
    [KIND:]PATH``), each of a kind read from its files and checked against the target
    (``tuner.engines.drafts``), before anything boots."""
    config = Path(model) / "config.json"
    if not config.exists():
        raise ConfigError(f"--model {model}: no config.json there")
    context = json.loads(config.read_text()).get("max_position_embeddings", max_model_len)
    named, kinds = {}, {}
    for text in drafts:
        kind, path = draft_kind(text)
        check_fits(kind, path, model)
        named[Path(path).name], kinds[Path(path).name] = path, kind
    return ModelSpec(model, named, min(max_model_len, int(context)), load_format, kinds, mtp_layers(model))
