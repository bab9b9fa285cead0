#!/usr/bin/env bash
# Every speculative method of the GPU space through the H200 engine's own parser (issue 28): `tuner plan`
# over search_spaces/gpu-h200.yaml with the generated drafts and heads, for ENGINE (vllm, the default, or
# sglang) installed at $ENGINES/ENGINE, planned for an H200 (--gpu-memory, so the same plan comes out on a
# machine without one), then each planned argv through tuner/engines/scripts/check_ENGINE.py in that
# engine's environment: vLLM's parser, validate_parsed_serve_args and create_engine_config; SGLang's
# parser and ServerArgs resolution; as each server runs them before it starts the engine.
# Run from anywhere once setup and the models are done; the tuner is the carried archive unpacked in $RUN
# (capacity_check.sh unpacks it). Writes $ROOT/cc/plans/{plan.txt,plan.err,verdicts.txt,summary.txt}.
# Off the H200 (SGLang's parser runs on a CPU machine): GPU_ROOT=DIR with DIR/run the repository,
# DIR/models/h200 the generated models, DIR/engines/ENGINE the engine's venv, and PY the tuner's Python.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
ENGINE=${ENGINE:-vllm}
D=$ROOT/cc/plans; mkdir -p "$D"
M=$MODELS
env "PYTHONPATH=$PYDEPS/tuner:$RUN" "$PY" -m tuner plan --workload rag --space "$RUN/search_spaces/gpu-h200.yaml" \
  --engines "$ENGINE" --n "${N:-48}" --seed 0 --model "$M/target" --draft-model "$M/draft-2l" --draft-model "$M/draft-1l" \
  --draft-model "$M/eagle3-head" --draft-model "$M/eagle-head" --engine-env "$ENGINE=$ENGINES/$ENGINE" \
  --gpu-memory "${GPU_MEMORY_GIB:-140.4}" --gpu-name "${GPU_NAME:-NVIDIA H200}" \
  > "$D/plan.txt" 2> "$D/plan.err"
echo "plan exited $?: $(wc -l < "$D/plan.txt") configs; $(head -c 400 "$D/plan.err")"
"$PY" - "$D/plan.txt" > "$D/argvs.json" <<'PY'
import json, sys
out = []
for line in open(sys.argv[1]):
    if line.startswith("{"):
        argv = json.loads(line)["argv"]
        out.append(argv[argv.index("-m") + 2:])  # after `-m MODULE`, as the server's parser sees them
json.dump(out, sys.stdout)
PY
timeout 900 "$ENGINES/$ENGINE/bin/python" "$RUN/tuner/engines/scripts/check_$ENGINE.py" < "$D/argvs.json" > "$D/verdicts.txt" 2> "$D/check.err"
echo "check exited $?"
"$PY" - "$D/plan.txt" "$D/verdicts.txt" "$ENGINE" <<'PY' | tee "$D/summary.txt"
import collections, json, sys
plans = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
verdicts = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
tally = collections.Counter()
for p, v in zip(plans, verdicts):
    params = p["params"]
    key = (p["engine_version"], params.get("spec_method"), params.get("draft_model", "-"), v["ok"], v.get("method"))
    tally[key] += 1
    if not v["ok"]:
        print("REJECTED", json.dumps(params), v["error"])
    elif v.get("speculative") and v.get("num_speculative_tokens") != params.get("num_speculative_tokens"):
        print("K NOT AS PLANNED", json.dumps(params), "parsed K", v.get("num_speculative_tokens"))
    elif params.get("spec_method", "off") != "off" and not v.get("speculative"):
        print("SPECULATION OFF", json.dumps(params))
print(f"{len(verdicts)} verdicts for {len(plans)} plans")
for (version, method, draft, ok, parsed), n in sorted(tally.items(), key=str):
    print(f"{sys.argv[3]} {version} {method} {draft}: ok={ok} parsed method={parsed} x{n}")
PY
