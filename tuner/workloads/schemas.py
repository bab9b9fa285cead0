"""The JSON schemas that the ``agent`` and ``json`` presets demand through ``response_format``.

Every string has a ``maxLength`` and every array a ``maxItems``, so an object that follows the
schema fits in the preset's ``max_tokens`` even when the model (random weights included) writes the
longest strings the grammar allows. Requests use OpenAI's structured-output form, which vLLM and
SGLang accept on ``/v1/chat/completions``:

    {"type": "json_schema", "json_schema": {"name": NAME, "schema": SCHEMA}}
"""

from __future__ import annotations

import json
from typing import Any


def _text(max_length: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


TOOLS = ("search_docs", "read_section", "run_example", "finish")

# the agent decides its next step; ``final_answer`` closes a task
AGENT_SCHEMAS: dict[str, dict[str, Any]] = {
    "next_action": _object(
        {
            "thought": _text(80),
            "tool": {"type": "string", "enum": list(TOOLS)},
            "arguments": _object({"query": _text(40)}),
        }
    ),
    "final_answer": _object(
        {
            "answer": _text(120),
            "sources": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "maxItems": 3},
        }
    ),
}

# extraction and classification of a passage, as API clients of structured output do
EXTRACTION_SCHEMAS: dict[str, dict[str, Any]] = {
    "ticket": _object(
        {
            "title": _text(60),
            "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
            "components": {"type": "array", "items": _text(20), "maxItems": 3},
        }
    ),
    "glossary": _object(
        {
            "terms": {
                "type": "array",
                "items": _object({"term": _text(24), "definition": _text(60)}),
                "maxItems": 2,
            }
        }
    ),
    "classification": _object(
        {
            "topic": {"type": "string", "enum": ["syntax", "data model", "execution", "library", "other"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "is_normative": {"type": "boolean"},
        }
    ),
    "summary": _object({"summary": _text(100), "keywords": {"type": "array", "items": _text(16), "maxItems": 4}}),
}


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` body field that demands JSON following ``schema``."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def schema_text(schema: dict[str, Any]) -> str:
    """The schema as a prompt shows it: compact, key order kept, stable bytes."""
    return json.dumps(schema, separators=(",", ":"))
