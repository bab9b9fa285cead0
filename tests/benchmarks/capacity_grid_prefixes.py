"""Which prompt blocks each request of the capacity table's workload shares: the prefix structure the
performance model's benchmark (``bench_model``) simulates the table's steps with.

The table (``measure_capacity_grid``, on d85b603) sent the rag preset as that commit built it, each step
from its first request on, and its rows keep only each request's token counts. The preset has changed
since, so the workload is rebuilt by that commit's own code and checked against the digest the table
recorded; then each prompt is tokenised with the target's tokenizer and cut into chained block keys
(``tuner.workloads.inspection.block_keys``), numbered in order of first appearance.

Run: ``git archive d85b603 tuner | tar -x -C DIR`` then
``.venv/bin/python -m tests.benchmarks.capacity_grid_prefixes --old DIR``; writes
``tests/benchmarks/data/capacity_grid_prefixes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer

from tests.benchmarks import _table
from tuner.workloads.inspection import block_keys

OUT = _table.CAPACITY_TABLE.parent / "capacity_grid_prefixes.json"
# Runs in the old code's tree: the table's workload as it was built, its digest and every prompt.
BUILD = """
import json, sys
from pathlib import Path
from tuner.engines.base import ModelSpec
from tuner.search.options import SearchOptions
from tuner.search.resolve import resolve_workload
model = ModelSpec(sys.argv[1], {}, int(sys.argv[2]))
opts = SearchOptions(workload="rag", objective="capacity-pareto")
w = resolve_workload(opts, model)
print(json.dumps({"digest": w.digest(), "requests": [[r.body["prompt"], r.prompt_tokens, r.max_tokens]
                                                     for r in w.requests]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the table's commit's tuner/, extracted")
    args = parser.parse_args()
    table = _table.load_capacity()
    model = _table.models(table)
    env = {**os.environ, "PYTHONPATH": str(args.old)}
    done = subprocess.run([sys.executable, "-c", BUILD, model.path, str(model.max_model_len)], env=env,
                          capture_output=True, text=True, check=True, cwd=args.old)  # fmt: skip
    built = json.loads(done.stdout.splitlines()[-1])
    if built["digest"] != table["workload"]["digest"]:
        rebuilt, recorded = built["digest"][:12], table["workload"]["digest"][:12]
        raise SystemExit(f"the rebuilt workload is {rebuilt}, the table's {recorded}: not the table's workload")
    tokenizer = Tokenizer.from_file(str(Path(model.path) / "tokenizer.json"))
    numbered: dict[bytes, int] = {}
    requests = []
    for prompt, prompt_tokens, max_tokens in built["requests"]:
        keys = block_keys(list(tokenizer.encode(prompt, add_special_tokens=False).ids))
        requests.append({"prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
                         "blocks": [numbered.setdefault(k, len(numbered)) for k in keys]})  # fmt: skip
    OUT.write_text(json.dumps({"digest": built["digest"], "requests": requests}) + "\n")
    print(f"{OUT}: {len(requests)} requests, {len(numbered)} distinct blocks")


if __name__ == "__main__":
    main()
