"""One real CUDA out-of-memory at boot, on purpose (issue 7). Run beside `tuner search` with the
tuner's dependencies and the image's torch on the path:

    python3 oom.py STORAGE STUDY LOG_DIR HOLD_GIB

Once the study holds its two enqueued engine defaults, enqueue one vLLM trial with memory fraction
0.95 (a user attribute says why). When that trial's log appears, i.e. while it boots, hold HOLD_GIB
of the GPU from this process with a plain torch allocation, as a second tenant of a shared GPU
would; release it as soon as the log shows vLLM's startup memory check failing (or after 240 s), so
the next trial gets the whole GPU again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import optuna

NOTE = "OOM on purpose: another process held {gib} GiB of the GPU while this trial booted (scripts/gpu/oom.py)"
FAILED = ("is less than desired GPU memory utilization", "Engine core initialization failed", "CUDA out of memory")


def say(*what: object) -> None:
    print(time.strftime("[%H:%M:%S]"), *what, flush=True)


def main(storage: str, name: str, log_dir: Path, gib: float) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = Path(storage.removeprefix("sqlite:///"))
    while not db.exists():  # let the tuner create the schema: two creators at once can collide
        time.sleep(1)
    time.sleep(3)
    while True:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
            if len(study.get_trials(deepcopy=False)) >= 2:
                break
        except (KeyError, Exception):  # noqa: BLE001 - not created yet, or the file is being created
            pass
        time.sleep(2)
    params = {"engine": "vllm", "vllm.chunk_size": 2048, "vllm.memory_fraction": 0.95, "vllm.num_speculative_tokens": 0}
    study.enqueue_trial(params, user_attrs={"note": NOTE.format(gib=gib)})
    number = max(t.number for t in study.get_trials(deepcopy=False))
    log = log_dir / f"trial-{number:04d}-vllm.log"
    say(f"enqueued trial {number} {params}; waiting for {log}")
    import torch  # the slow import before the trial starts; CUDA itself is touched only when needed

    while not log.exists():
        time.sleep(0.2)
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    say(f"holding {gib} GiB; free {free / 2**30:.2f} of {total / 2**30:.2f} GiB")
    deadline = time.time() + 240
    while time.time() < deadline:
        text = log.read_text(errors="replace")
        hit = next((p for p in FAILED if p in text), None)
        if hit:
            say(f"trial {number} log shows {hit!r}")
            break
        time.sleep(0.2)
    else:
        say("deadline reached without the failure text")
    del held
    torch.cuda.empty_cache()
    say("released")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]))
