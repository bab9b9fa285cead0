"""The chat template of the generated models, rendered in Python to count chat prompts exactly.

A server turns ``messages`` into one prompt with the model's chat template and counts its tokens;
the tuner renders the same template here (no transformers, no Jinja) and counts with ``tokenizers``.
The template is ``CHAT_TEMPLATE`` of ``tuner/engines/scripts/make_models.py``: each message is
``<|role|>`` and its content on their own lines, then ``<|assistant|>`` opens the reply:

    <|system|>\\nYou are ...\\n<|user|>\\nHello\\n<|assistant|>\\n

A follow-up turn's prompt therefore starts with the previous turn's whole prompt, then the
previous response: exactly the text a prefix cache can reuse. For a model whose own template
differs, chat lengths are this template's, and ``check_template`` says so once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

GENERATION_PROMPT = "<|assistant|>\n"


def render_message(role: str, content: str) -> str:
    return f"<|{role}|>\n{content}\n"


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text the server builds from ``messages``; content must be a string."""
    text = "".join(render_message(str(m["role"]), str(m["content"])) for m in messages)
    return text + GENERATION_PROMPT if add_generation_prompt else text


def render_follow_up(new_messages: Sequence[Mapping[str, Any]]) -> str:
    """What a turn appends after the previous response: the response's closing newline, its own
    messages, and the opening of the next reply."""
    return "\n" + render_chat(new_messages)


def model_template(model_dir: Path) -> str | None:
    """The chat template a model folder declares (``chat_template.jinja`` wins, as in transformers)."""
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    return template if isinstance(template, str) else None


def is_generated_template(template: str | None) -> bool:
    """Whether ``template`` is the generated models' one, whose text ``render_chat`` reproduces."""
    return template is not None and "'<|' + message['role'] + '|>\\n'" in template and "<|assistant|>" in template


def check_template(model_dir: Path, workload: str) -> None:
    """One line on stderr when chat prompt lengths cannot be exact for this model."""
    template = model_template(model_dir)
    if is_generated_template(template):
        return
    why = "has no chat template" if template is None else "has its own chat template"
    print(
        f"{workload}: the model {why}; chat prompt lengths are counted with the tuner's role-tagged "
        "template and may differ by a few tokens per message from the server's",
        file=sys.stderr,
    )
