"""Drafts and heads told apart from their files, and matched to the target they would serve.

A folder given with ``--draft-model`` is a draft model, an EAGLE head or an EAGLE-3 head: its
*kind*, the method it serves (``tuner.engines.speculation.WITH_DRAFT``). The kind is read from its
``config.json``, whose architectures name a head (``LlamaForCausalLMEagle3``,
``Eagle3LlamaForCausalLM``: EAGLE-3; ``LlamaForCausalLMEagle``, ``EagleLlamaForCausalLM``: EAGLE),
or given before the path (``eagle3:/path``) for a head whose config names a plain architecture, as
EAGLE-1 heads often do. Before anything boots, a head must fit its target: the same hidden size
(an EAGLE-3 head's ``target_hidden_size`` where it has one) and the same vocabulary, of which an
EAGLE-3 head drafts a part (``draft_vocab_size``); a draft model must share the vocabulary.

A target ships MTP layers when its ``config.json`` counts them (``MTP_LAYER_KEYS``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.engines.speculation import DRAFT_MODEL, LABELS, WITH_DRAFT
from tuner.errors import ConfigError

# config.json keys that count a target's multi-token-prediction layers: DeepSeek-V3, GLM-4.5 and
# MiMo (num_nextn_predict_layers); Qwen3-Next and Qwen3.5 (mtp_num_hidden_layers)
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def _config(path: str, what: str) -> dict[str, Any]:
    file = Path(path) / "config.json"
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what} {path}: no readable config.json there") from exc
    if not isinstance(found, dict):
        raise ConfigError(f"{what} {path}: its config.json is not a mapping")
    return found


def split_kind(text: str) -> tuple[str | None, str]:
    """``KIND:PATH`` into the kind given and the path; a plain path has no kind given."""
    kind, sep, path = text.partition(":")
    if sep and kind in WITH_DRAFT:
        return kind, path
    return None, text


def kind_from_config(config: dict[str, Any]) -> str:
    """The method a folder's ``config.json`` says it serves: a head its architectures name, else a draft."""
    names = [str(a).lower() for a in config.get("architectures") or []]
    if any("eagle3" in n for n in names):
        return "eagle3"
    if any("eagle" in n for n in names):
        return "eagle"
    return DRAFT_MODEL


def draft_kind(text: str) -> tuple[str, str]:
    """The kind and path of one ``--draft-model`` value."""
    given, path = split_kind(text)
    return given or kind_from_config(_config(path, "--draft-model")), path


def check_fits(kind: str, path: str, target: str) -> None:
    """Refuse, in one line, a draft or head that cannot serve ``target``."""
    head, served = _config(path, "--draft-model"), _config(target, "--model")
    label = "a draft model" if kind == DRAFT_MODEL else f"an {LABELS.get(kind, kind)} head"
    vocab, target_vocab = head.get("vocab_size"), served.get("vocab_size")
    if vocab != target_vocab:
        raise ConfigError(
            f"--draft-model {path}: {label} of vocabulary {vocab} cannot serve {target} (vocabulary {target_vocab})"
        )
    if kind == DRAFT_MODEL:
        return
    hidden = head.get("target_hidden_size") or head.get("hidden_size")
    if hidden != served.get("hidden_size"):
        raise ConfigError(
            f"--draft-model {path}: {label} for hidden size {hidden} cannot serve {target} "
            f"(hidden size {served.get('hidden_size')})"
        )
    drafted = head.get("draft_vocab_size")
    if drafted is not None and not 0 < int(drafted) <= int(target_vocab or 0):
        raise ConfigError(
            f"--draft-model {path}: draft_vocab_size {drafted} is not part of the vocabulary {target_vocab}"
        )


def mtp_layers(target: str) -> int:
    """How many MTP layers the target's ``config.json`` says it ships (0: none, or unreadable)."""
    try:
        config = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))
        return max((int(config.get(key) or 0) for key in MTP_LAYER_KEYS), default=0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
