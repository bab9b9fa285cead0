"""Shared fixtures: a small BPE tokenizer trained offline on the packaged corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = Path(__file__).resolve().parents[2] / "tuner" / "workloads" / "corpus.txt"


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """A ~4000-token byte-level BPE: real merges on real text, so counts behave like a model's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([str(CORPUS)], trainer)
    return tok
