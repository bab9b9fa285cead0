"""Turn what came back from the H200 study (scripts/gpu/poll.sh's logs.tar.gz, unpacked, and the
study's SQLite file) into test captures under tests/data/captures/, with machine paths replaced by
the placeholders tests/data/captures/README.md describes. Files are copied whole, line for line,
except for those replacements; pynvml samples are cut to the named trials' time windows.

    python scripts/gpu/make_captures.py UNPACKED_DIR STUDY_DB DATE
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "data" / "captures"
# Longest first: a path is replaced before any prefix of it.
PLACEHOLDERS = (
    ("/root/models/h200/draft-2l", "<draft>"),
    ("/root/models/h200/target", "<model>"),
    ("/root/pydeps/vllm", "<site>"),
    ("/root/pydeps/sglang", "<site>"),
    ("/opt/torch/.venv/lib/python3.12/site-packages", "<image-site>"),
    ("/root/engines/vllm/bin/python", "<engine-python>"),
    ("/root/engines/sglang/bin/python", "<engine-python>"),
    ("/usr/lib/python3.12", "<stdlib>"),
    ("/root/run/studies/logs/rag-h200", "<logs>"),
    ("/root", "<home>"),
)

# (source under the unpacked folder, engine, destination name)
LOGS = (
    ("run/studies/logs/rag-h200/trial-0000-vllm.log", "vllm", "trial-0000-vllm-defaults-served.log"),
    ("run/studies/logs/rag-h200/trial-0002-vllm.log", "vllm", "trial-0002-vllm-oom-60GiB-held-util-0.95.log"),
    ("run/studies/logs/rag-h200/trial-0006-vllm.log", "vllm", "trial-0006-vllm-chunk512-draft-k4-rejected.log"),
    ("run/studies/logs/rag-h200/trial-0010-vllm.log", "vllm", "trial-0010-vllm-ngram-k5-served.log"),
    ("captures/oom.log", "vllm", "oom-holder-trial-0002.log"),
    ("run/studies/logs/rag-h200/trial-0001-sglang.log", "sglang", "trial-0001-sglang-defaults-served.log"),
    ("run/studies/logs/rag-h200/trial-0007-sglang.log", "sglang", "trial-0007-sglang-standalone-k2-served.log"),
)
# /metrics scrapes by the sidecar: (trial, engine, which) -> metrics-trial-NNNN-<engine>-<which>.prom
SCRAPES = ((0, "vllm"), (10, "vllm"), (1, "sglang"), (7, "sglang"), (5, "sglang"))
NVML_TRIALS = (2, 10)


def scrub(text: str) -> str:
    for path, placeholder in PLACEHOLDERS:
        text = text.replace(path, placeholder)
    return text


def main(src: Path, db: Path, date: str) -> None:
    dest = {"vllm": CAPTURES / f"vllm-0.26.0-h200-{date}", "sglang": CAPTURES / f"sglang-0.5.17-h200-{date}"}
    for d in dest.values():
        d.mkdir(parents=True, exist_ok=True)
    for rel, engine, name in LOGS:
        (dest[engine] / name).write_text(scrub((src / rel).read_text(errors="replace")))
    con = sqlite3.connect(db)
    attrs = {
        (n, k): json.loads(v)
        for n, k, v in con.execute(
            "select t.number, a.key, a.value_json from trial_user_attributes a join trials t using (trial_id)"
        )
    }
    utc = datetime.UTC
    stamp = lambda s: datetime.datetime.fromisoformat(s).replace(tzinfo=utc).timestamp()  # noqa: E731
    windows = {
        n: (stamp(a), stamp(b))
        for n, a, b in con.execute("select number, datetime_start, datetime_complete from trials")
    }
    for number, engine in SCRAPES:
        argv = attrs[(number, "argv")]
        port = argv[argv.index("--port") + 1]
        for which in ("first", "last"):
            (found,) = (src / "captures" / "metrics").glob(f"{engine}-port{port}-pid*-{which}.prom")
            (dest[engine] / f"metrics-trial-{number:04d}-{engine}-{which}.prom").write_text(scrub(found.read_text()))
    lines = (src / "captures" / "nvml.jsonl").read_text().splitlines()
    head, rows = lines[0], [json.loads(x) for x in lines[1:]]
    for number in NVML_TRIALS:
        a, b = windows[number]
        picked = [json.dumps(r) for r in rows if "t" in r and a - 1 <= r["t"] <= b + 1]
        (dest["vllm"] / f"pynvml-trial-{number:04d}.jsonl").write_text("\n".join([head, *picked]) + "\n")
    (dest["vllm"] / "nvidia-smi-during-study.csv").write_text((src / "captures" / "nvidia_smi.csv").read_text())
    print("\n".join(sorted(str(p.relative_to(ROOT)) for d in dest.values() for p in d.iterdir())))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
