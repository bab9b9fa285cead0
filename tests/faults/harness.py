"""Running the real CLI against fault engines: a tiny model folder, the engine wrapper, a study."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tuner" / "workloads" / "corpus.txt"
# No memory_fraction: nothing for the memory screen to judge, and every trial boots.
SPACE = (
    "engines: [vllm]\nparameters:\n  chunk_size: {choices: [256, 512, 1024, 2048]}\n"
    "  max_num_seqs: {choices: [1, 2, 4, 8]}\n"
)
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "head_dim": 64,
          "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4, "intermediate_size": 768,
          "max_position_embeddings": 4096, "vocab_size": 4000, "dtype": "bfloat16"}  # fmt: skip


def make_model(folder: Path) -> Path:
    """A model folder with a config and a real BPE tokenizer (trained on the packaged corpus), no weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train([str(CORPUS)], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


@dataclass
class FaultEngine:
    """The wrapper to pass as ``--engine-env vllm=PATH`` and the folder its events go to."""

    python: Path
    folder: Path

    def events(self) -> list[str]:
        try:
            return (self.folder / "events").read_text().splitlines()
        except OSError:
            return []

    def boots(self) -> int:
        return sum(e.split()[1:2] == ["boot"] for e in self.events())

    def wait_for(self, word: str, timeout_s: float = 60.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(word in e for e in self.events()) < count:
            assert time.monotonic() < deadline, f"no {word!r} event in {timeout_s} s: {self.events()[-5:]}"
            time.sleep(0.05)


def make_engine(folder: Path) -> FaultEngine:
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "engine-python"
    python.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.faults.fault_engine import main\nmain(sys.argv[1:])\n"
    )
    python.chmod(0o755)
    return FaultEngine(python, folder)


@dataclass
class Study:
    """One study on SQLite in a test's folder, and the flags every search of it passes."""

    name: str
    storage: str
    flags: list[str]

    def search(self, trials: int, *extra: str) -> tuple[int, str]:
        return run_cli(["search", *self.flags, "--trials", str(trials), *extra])

    def search_argv(self, trials: int, *extra: str) -> list[str]:
        return [sys.executable, "-m", "tuner", "search", *self.flags, "--trials", str(trials), *extra]

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name=self.name, storage=self.storage).get_trials()


def make_study(where: Path, model: Path, engine: FaultEngine, storage: str | None = None) -> Study:
    (where / "space.yaml").write_text(SPACE)
    storage = storage or f"sqlite:///{where / 'study.db'}"
    flags = ["--workload", "rag", "--model", str(model), "--engine-env", f"vllm={engine.python}",
             "--space", str(where / "space.yaml"), "--study", "faults", "--storage", storage, "--requests", "8",
             "--finalists", "0", "--repeats", "0", "--no-stress", "--no-screen", "--no-prune",
             "--objective", "pareto"]  # fmt: skip
    return Study("faults", storage, flags)


def run_cli(args: list[str]) -> tuple[int, str]:
    """``tuner ARGS`` in this process, as a user runs it: the exit code and what went to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    return code, err.getvalue()


def spawn(argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The CLI as its own process (to be signalled), logging to ``log``."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=full)


def states(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[str, str | None]]:
    return [(t.state.name, t.user_attrs.get("failure")) for t in trials]


def lost(before: list[optuna.trial.FrozenTrial], after: list[optuna.trial.FrozenTrial]) -> int:
    """Finished trials of ``before`` that ``after`` no longer has as they were (state, values, attributes)."""
    now = {t.number: t for t in after}
    finished = [t for t in before if t.state.is_finished() and t.state.name != "FAIL"]
    return sum(
        1
        for t in finished
        if t.number not in now
        or (now[t.number].state, now[t.number].values, now[t.number].user_attrs) != (t.state, t.values, t.user_attrs)
    )


def resumed(engine: FaultEngine, boots_before: int, before: list[optuna.trial.FrozenTrial],
            after: list[optuna.trial.FrozenTrial]) -> bool:  # fmt: skip
    """The next search went on: it booted an engine again, and a new trial served (a config measured
    before may also come back as a twin told without a boot, carrying its twin's class)."""
    new = after[len(before) :]
    served = [t for t in new if t.state.name == "COMPLETE" and t.user_attrs.get("failure") is None]
    return engine.boots() > boots_before and bool(served)
