"""Running the real CLI against fault engines: a tiny model folder, the engine wrapper, a study."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
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

    def ended(self, boot: int) -> str:
        """How the engine of the ``boot``-th boot (from 0) ended, as its own events tell: a SIGTERM it
        logged is the tuner stopping it; none means it exited or was killed some other way."""
        events = self.events()
        pids = [e.split()[0] for e in events if e.split()[1:2] == ["boot"]]
        if boot >= len(pids):
            return f"engine {boot} never booted"
        return "stopped with SIGTERM" if f"{pids[boot]} term" in events else "ended without a SIGTERM"

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


# What a row says the tuner did is composed of these, each read from the process, the study or the
# engine's events, never picked by the class the test expects: a wrong outcome reads as wrong.
LAST_LINE_CHARS = 200  # of what a command said last: its one line to the user fits, a log's tail does not


def exited(code: int | None, said: str, who: str = "the search") -> str:
    """How a command ended: its status or the signal that ended it, a traceback if it printed one,
    and its last line when it did not succeed (what the user was told)."""
    if code is None:
        return f"{who} did not end"
    if code < 0:
        return f"{who} was ended by {signal.Signals(-code).name}"
    text = f"{who} exited {code}" + (" with a traceback" if "Traceback" in said else "")
    last = next((line.strip() for line in reversed(said.splitlines()) if line.strip()), "")
    last = last if len(last) <= LAST_LINE_CHARS else last[: LAST_LINE_CHARS - 1] + "…"
    return f"{text}: {last!r}" if code != 0 and last else text


def recorded_class(trial: optuna.trial.FrozenTrial) -> str:
    """What the study holds for a trial: its failure class, else served and how it was scored, or the
    state of a trial that was never told (RUNNING, FAIL)."""
    if trial.state.name != "COMPLETE":
        return trial.state.name
    failure = trial.user_attrs.get("failure")
    if failure is not None:
        return str(failure)
    return "served (feasible)" if trial.user_attrs.get("constraint_violation", 0) <= 0 else "served (infeasible)"


def measured(trial: optuna.trial.FrozenTrial) -> list[str]:
    """What a trial's record says was measured: the workload's requests and errors, a finite TPOT, the
    server-side stats when /metrics gave none, and the score's feasibility."""
    attrs = trial.user_attrs
    metrics = attrs.get("metrics")
    if not isinstance(metrics, dict) or not metrics.get("n_requests"):
        facts = ["sent no request"]
    else:
        facts = [f"measured {metrics['n_requests']:.0f} requests, {metrics.get('n_errors', 0):.0f} failed"]
        tpot = metrics.get("tpot_p95_ms")
        if isinstance(tpot, int | float) and math.isfinite(tpot):
            facts.append(f"TPOT p95 {tpot:.1f} ms")
        server = attrs.get("server")
        if not isinstance(server, dict) or server.get("server_ttft_mean_ms") is None:
            facts.append("no server-side stats from /metrics")
    if trial.state.name == "COMPLETE":
        facts.append("scored infeasible" if attrs.get("constraint_violation", 0) > 0 else "scored feasible")
    return facts


def reclaimed(before: list[optuna.trial.FrozenTrial], after: list[optuna.trial.FrozenTrial], number: int = 1) -> str:
    """Trial ``number`` as the study held it after the fault, then (``after`` not empty: the next search
    ran) as it holds it after the next search."""
    held = [recorded_class(t[number]) if len(t) > number else f"no trial {number}" for t in (before, after) if t]
    return ", then ".join(held) or f"no trial {number}"
