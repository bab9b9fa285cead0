"""``tuner verify``'s client commands through the engines' own benchmark parsers, in their environments.

vLLM: ``vllm.benchmarks.serve.add_cli_args`` (what ``vllm bench serve`` parses with) on the CPU build
here; 0.26's flags are the ones its H200 capture's Namespace line shows (tests/data/captures/README.md).
SGLang 0.5.23 cannot serve on this machine, but its ``sglang.bench_serving`` parser runs: its
``cli_main`` is called with ``run_benchmark`` replaced, so the parsed namespace is read and nothing is sent
(tests/e2e/test_workloads_e2e.py sends with SGLang's client to the vLLM CPU build's server).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tuner.engines import ADAPTERS
from tuner.engines.base import sharegpt_dataset
from tuner.engines.env import probe
from tuner.engines.models import default_models
from tuner.engines.sglang import BENCH_SERVING
from tuner.engines.vllm import BENCH_DATASET, BENCH_SERVE

PARSE = {
    "vllm": (
        "import argparse, json, sys\n"
        "from vllm.benchmarks import serve\n"
        "parser = argparse.ArgumentParser()\n"
        "serve.add_cli_args(parser)\n"
        "args = vars(parser.parse_args(json.loads(sys.stdin.read())))\n"
        "print(json.dumps({k: v for k, v in args.items() if v is None or isinstance(v, (str, int, float, bool))}))\n"
    ),
    "sglang": (
        "import json, sys\n"
        "from sglang.benchmark import serving\n"
        "got = {}\n"
        "serving.run_benchmark = lambda args: got.update(vars(args))\n"
        "sys.argv = ['bench_serving', *json.loads(sys.stdin.read())]\n"
        "serving.cli_main()\n"
        "print(json.dumps(got, default=str))\n"
    ),
}
# what each client must be told, as the parsed namespace says it
EXPECTED: dict[str, dict[str, Any]] = {
    "vllm": {"dataset_name": "sharegpt", "disable_shuffle": True, "sharegpt_output_len": None, "ignore_eos": True,
             "temperature": 0.0, "request_rate": 2.5, "burstiness": 1.0, "num_prompts": 30, "seed": 0,
             "save_detailed": True, "save_result": True, "endpoint": "/v1/completions", "num_warmups": 0,
             "tokenizer": "/m/folder", "model": "served-name", "no_oversample": True,
             "result_dir": "/tmp/x", "result_filename": "r.json"},
    "sglang": {"backend": "sglang-oai", "dataset_name": "sharegpt", "sharegpt_output_len": None, "temperature": 0.0,
               "request_rate": 2.5, "num_prompts": 30, "seed": 0, "output_details": True,
               "output_file": "/tmp/x/r.json", "warmup_requests": 0, "disable_ignore_eos": False,
               "tokenizer": "/m/folder", "model": "served-name"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_the_client_argv_parses_to_what_verify_means(name: str) -> None:
    adapter = ADAPTERS[name]()
    env = probe(adapter)
    assert adapter.bench_own_output_lens  # each request at its own output length, told in the file
    argv = adapter.bench_argv(env.python, "http://127.0.0.1:8000", "served-name", "/m/folder", "/tmp/x/d.json",
                              "/tmp/x/r.json", 2.5, 30, None, 0)  # fmt: skip
    assert argv[0] == env.python
    flags = argv[3:]  # after python -c BENCH_SERVE or BENCH_SERVING
    assert argv[1:3] == ["-c", BENCH_SERVE if name == "vllm" else BENCH_SERVING]
    done = subprocess.run([env.python, "-c", PARSE[name]], input=json.dumps(flags), capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert {key: parsed[key] for key in EXPECTED[name]} == EXPECTED[name]
    assert parsed["dataset_path"] == "/tmp/x/d.json" and parsed["base_url"] == "http://127.0.0.1:8000"


# vLLM's real ShareGPT reader, as BENCH_SERVE leaves it: it keeps a prompt over its own 1024-token
# filter and gives each request its entry's length, in the file's order
SAMPLE = BENCH_DATASET + (
    "import json, sys\n"
    "from transformers import AutoTokenizer\n"
    "path, model = sys.argv[1:]\n"
    "reader = datasets.ShareGPTDataset(dataset_path=path, random_seed=0, disable_shuffle=True)\n"
    "samples = reader.sample(AutoTokenizer.from_pretrained(model), num_requests=3, output_len=None, "
    "no_oversample=True)\n"
    "print(json.dumps([[s.prompt, s.prompt_len, s.expected_output_len] for s in samples]))\n"
)


def test_vllm_client_reads_every_prompt_at_its_own_output_length(tmp_path: Path) -> None:
    env = probe(ADAPTERS["vllm"]())
    model = default_models(env.python, 2048).path
    prompts = ["a short prompt of a few words", " ".join(["word"] * 1500), "the third prompt"]
    dataset = tmp_path / "d.json"
    dataset.write_text(sharegpt_dataset(prompts, [7, 300, 1]))
    done = subprocess.run([env.python, "-c", SAMPLE, str(dataset), model], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    samples = json.loads(done.stdout.strip().splitlines()[-1])
    assert [s[0] for s in samples] == prompts and [s[2] for s in samples] == [7, 300, 1]
    assert samples[1][1] > 1024  # over the reader's own filter, kept
