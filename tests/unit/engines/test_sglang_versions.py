"""SGLang 0.5.17 awareness, checked against the server_args it printed in a real H200 boot log.

SGLang 0.5.17 cannot be installed here (it pins a CUDA torch 2.11), but its boot log lists every
``ServerArgs`` field. Every flag the adapter emits for 0.5.17 must name one of those fields.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.sglang import SglangAdapter

LOG = Path(__file__).resolve().parents[2] / "data" / "captures" / "sglang-0.5.17-h200" / "boot_ok_8b_dummy_default.log"
MODEL = ModelSpec("/m/target", {"d": "/m/draft"}, 4096)
GPU = Device("cuda", "H200", 143 * 2**30)


def server_args_fields() -> set[str]:
    text = LOG.read_text(encoding="utf-8")
    return set(re.findall(r"[ (]([a-z_][a-z0-9_]*)=", text[text.index("server_args=ServerArgs(") :]))


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"chunk_size": 512, "memory_fraction": 0.8, "max_num_seqs": 16},
        {"num_speculative_tokens": 3, "draft_model": "d"},
        {"num_speculative_tokens": 2, "draft_model": "ngram"},
    ],
)
def test_every_flag_names_a_server_args_field_of_0_5_17(params: dict[str, object]) -> None:
    fields = server_args_fields()
    assert len(fields) > 100, "the capture should list the whole ServerArgs"
    argv = SglangAdapter().launch(Config("sglang", params), MODEL, GPU, 30000, "python3", "0.5.17").argv
    flags = [a[2:].replace("-", "_") for a in argv if a.startswith("--")]
    assert flags and [f for f in flags if f not in fields] == []
