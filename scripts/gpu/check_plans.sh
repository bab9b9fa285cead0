#!/usr/bin/env bash
# Every speculative method of the GPU space through the H200 engine's own parser (issue 28): `tuner plan`
# over search_spaces/gpu-h200.yaml with the generated drafts and heads, on the installed vLLM, then each
# planned argv through tuner/engines/scripts/check_vllm.py in that vLLM's environment (the parser,
# validate_parsed_serve_args and create_engine_config, as the server runs them before it starts the engine).
# Run from anywhere once setup and the models are done; the tuner is the carried archive unpacked in $RUN
# (capacity_check.sh unpacks it). Writes $ROOT/cc/plans/{plan.txt,plan.err,verdicts.txt,summary.txt}.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
D=$ROOT/cc/plans; mkdir -p "$D"
M=$MODELS
env "PYTHONPATH=$PYDEPS/tuner:$RUN" "$PY" -m tuner plan --workload rag --space "$RUN/search_spaces/gpu-h200.yaml" \
  --engines vllm --n "${N:-48}" --seed 0 --model "$M/target" --draft-model "$M/draft-2l" --draft-model "$M/draft-1l" \
  --draft-model "$M/eagle3-head" --draft-model "$M/eagle-head" --engine-env "vllm=$ENGINES/vllm" \
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
timeout 900 "$ENGINES/vllm/bin/python" "$RUN/tuner/engines/scripts/check_vllm.py" < "$D/argvs.json" > "$D/verdicts.txt" 2> "$D/check.err"
echo "check exited $?"
"$PY" - "$D/plan.txt" "$D/verdicts.txt" <<'PY' | tee "$D/summary.txt"
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
print(f"{len(verdicts)} verdicts for {len(plans)} plans")
for (version, method, draft, ok, parsed), n in sorted(tally.items(), key=str):
    print(f"vllm {version} {method} {draft}: ok={ok} parsed method={parsed} x{n}")
PY
