#!/usr/bin/env bash
# The tuner's capacity measurement against vLLM's own benchmark client, on the H200 machine.
# Start it, from the repository copy, once setup and the models are under way (it waits for them):
#   cp -r scripts/gpu /root/state/cc-scripts
#   [DEADLINE=EPOCH_S] [CFGS="defaults draft"] \
#     setsid nohup bash /root/state/cc-scripts/capacity_check.sh > /root/state/cc.log 2>&1 < /dev/null &
# and poll it from later calls (waits up to WAIT_S for DONE, then puts what there is into $OUT):
#   bash scripts/gpu/capacity_check.sh poll WAIT_S
# The deadline can be moved while it runs: a file $STATE/cc.deadline (epoch seconds) overrides DEADLINE,
# read again before every step (a step already running keeps the timeout it started with):
#   echo EPOCH_S > /root/state/cc.deadline
#
# It unpacks the carried `git archive` of the tag (.gpubundle/tuner-head.tar.gz, its commit in
# .gpubundle/tuner-head.commit) into $RUN and, for each config in CFGS, boots ONE vLLM server (the engine
# wrapper, VLLM_SERVER_DEV_MODE=1 so the tuner can reset the prefix cache, study.sh's compile caches,
# its log in $CKD/server_CFG.log):
#   defaults: --max-model-len 8192
#   eager:    --max-model-len 8192 --enforce-eager
#   draft:    --max-model-len 8192 --enable-chunked-prefill --max-num-batched-tokens 2048
#             --gpu-memory-utilization 0.9 --speculative-config {draft-2l, K=3, draft_model}
# then runs that config's steps on that boot, in the order STEPS_CFG gives (words drive1, drive2, verify):
#   STEPS_defaults="drive1 drive2 verify"   STEPS_draft="drive1 verify drive2"
# driveN: `tuner drive --capacity --tier interactive --json` (drive_CFG_N.json, progress in .err);
# verify: `tuner verify --rate C --engine-env vllm=ENGINES/vllm` (C: drive 1's interactive capacity;
# verify_CFG.json, its client's files in verify_CFG/) if the archive has that command, else vLLM's
# `vllm bench serve` itself at 1.0x and 1.2x C after a prefix-cache reset (bench_CFG_1.0.json,
# bench_CFG_1.2.json, on 2000 distinct prompts from `tuner workload rag --requests 2000 --seed 0`).
# After every step a /metrics scrape (metrics_CFG_STEP.txt) and its prefix-cache hit rate in the log, and
# during a drive the running hit rate every SCRAPE_S seconds (hit_CFG.txt);
# at the end metrics_CFG_end.txt and the server's stop (its process group: SIGTERM, then SIGKILL after STOP_S).
# Every step runs under `timeout`, clipped to the deadline (epoch seconds; 0: none), and a step that has
# less than its minimum left is skipped, so one hang cannot eat the lease. Progress: $CKD/progress.log;
# $CKD/DONE at the end.
set -uo pipefail
REPO=$(pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
CKD=$ROOT/cc  # (not CC: the image exports CC, the C compiler that inductor runs)
mkdir -p "$CKD"
LOG=$CKD/progress.log
log() { echo "[$(date -u +%T)] $*" | tee -a "$LOG"; }

if [ "${1:-}" = poll ]; then  # ---- a polling call: wait, then copy the results into $OUT
  end=$(( $(date +%s) + ${2:-0} ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$CKD/DONE" ]; do sleep 3; done
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  cp "$LOG" "$OUT/progress.log" 2>/dev/null
  # small: what the report needs (drives, verify, hit rates, server logs' tails); big: the rest but the
  # datasets and the client's per-request results, which travel alone (they can be many MB)
  for f in "$CKD"/server_*.log; do [ -f "$f" ] && tail -200 "$f" > "${f%.log}.tail"; done
  ( cd "$ROOT" && tar -czf "$OUT/cc-small.tar.gz" $(ls -d cc/progress.log cc/*.json cc/*.err cc/hit_*.txt \
      cc/verify_*/*.log cc/server_*.tail state/*.probe state/setup.log state/models.log models/h200/DONE \
      models/h200/target/config.json 2>/dev/null) 2>/dev/null )
  tar -czf "$OUT/cc.tar.gz" -C "$ROOT" --exclude=cc/custom.jsonl --exclude=cc/prompts.jsonl --exclude='dataset-*' \
    --exclude='cc/verify_*/result-*' --exclude='*.jsonl' \
    $(cd "$ROOT" && ls -d cc state/*.log state/*.probe models/h200/DONE 2>/dev/null) 2>/dev/null
  r=$(cd "$ROOT" && ls -d cc/verify_*/result-* 2>/dev/null)
  [ -z "$r" ] || tar -czf "$OUT/verify-results.tar.gz" -C "$ROOT" $r 2>/dev/null
  tail -25 "$LOG" 2>/dev/null
  bash "$HERE/status.sh" 2>/dev/null | grep -v '^--- search' | head -12
  ls -la "$OUT"; date -u
  exit 0
fi

DEADLINE=${DEADLINE:-0}
CFGS=${CFGS:-defaults draft}
STEPS_defaults=${STEPS_defaults:-drive1 drive2 verify}
STEPS_draft=${STEPS_draft:-drive1 verify drive2}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
WAIT_S=${WAIT_S:-900} BOOT_S=${BOOT_S:-480} DRIVE_S=${DRIVE_S:-600} VERIFY_S=${VERIFY_S:-360}
BENCH_S=${BENCH_S:-180} STOP_S=${STOP_S:-30} SCRAPE_S=${SCRAPE_S:-20}
DRIVE_MIN_S=${DRIVE_MIN_S:-150} VERIFY_MIN_S=${VERIFY_MIN_S:-120} BOOT_MIN_S=${BOOT_MIN_S:-200}
deadline() {  # $STATE/cc.deadline (epoch seconds, one number) overrides DEADLINE while it runs
  local d; d=$({ tr -dc 0-9 < "$STATE/cc.deadline"; } 2>/dev/null); echo "${d:-$DEADLINE}"
}
left() { local d; d=$(deadline); if [ "$d" -gt 0 ]; then echo $(( d - $(date +%s) )); else echo 999999; fi; }
# budget T MIN: the seconds a step may take (T, clipped to the deadline), or nothing if under MIN
budget() { local l; l=$(left); [ "$l" -lt "$1" ] || l=$1; [ "$l" -ge "$2" ] && echo "$l"; }

http() {  # http GET|POST URL: the body to stdout; exit 0 on a 2xx
  "$PY" - "$@" <<'PY'
import sys, urllib.request
method, url = sys.argv[1], sys.argv[2]
req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        sys.stdout.write(r.read().decode())
        sys.exit(0 if 200 <= r.status < 300 else 1)
except Exception as e:
    sys.stderr.write(f"{e}\n")
    sys.exit(1)
PY
}

hit_rate() {  # hit_rate METRICS_FILE: vllm:prefix_cache_hits / vllm:prefix_cache_queries (counters)
  "$PY" - "$1" <<'PY'
import re, sys
tot = {"hits": 0.0, "queries": 0.0}
for line in open(sys.argv[1]):
    m = re.match(r"vllm:prefix_cache_(hits|queries)(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", line.strip())
    if m:
        tot[m.group(1)] += float(m.group(2))
q = tot["queries"]
print(f"hits {tot['hits']:.0f} queries {q:.0f} rate {tot['hits'] / q:.4f}" if q else f"no queries ({tot})")
PY
}

recount() {  # recount DIR: bench_attainment of every client result file in DIR (my own count, all requests)
  local f
  for f in "$1"/result-*.json; do
    [ -f "$f" ] && echo "recount $(basename "$f"): $(bench_attainment "$f" 2>&1 | tail -1)"
  done
}

capacity_of() {  # capacity_of DRIVE_JSON: the interactive tier's capacity_req_s
  "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['capacity']['tiers']['interactive']['capacity_req_s'])" "$1" 2>/dev/null
}

SLO_TTFT_MS=${SLO_TTFT_MS:-300} SLO_TPOT_MS=${SLO_TPOT_MS:-100}  # rag's GPU interactive tier
bench_attainment() {  # bench_attainment BENCH_JSON: interactive attainment over every request sent
  "$PY" - "$1" "$SLO_TTFT_MS" "$SLO_TPOT_MS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
TTFT, TPOT = float(sys.argv[2]), float(sys.argv[3])
ok = n = 0
for ttft, itl, out in zip(d["ttfts"], d["itls"], d["output_lens"]):
    n += 1
    if out and out > 1 and ttft is not None and ttft > 0:
        tpot = sum(itl) / (out - 1)
        ok += ttft * 1e3 <= TTFT and tpot * 1e3 <= TPOT
sent = d.get("num_prompts", n)
print(f"attainment {ok / max(sent, n):.3f} ({ok} of {max(sent, n)}; completed {d.get('completed')}, "
      f"failed {d.get('failed')}, rate {d.get('request_rate')}, duration {d.get('duration', 0):.1f} s)")
PY
}

SPID=
stop_server() {  # the whole process group: SIGTERM, then SIGKILL after STOP_S
  [ -n "$SPID" ] || return 0
  log "stopping the server (pgid $SPID)"
  kill -TERM -- "-$SPID" 2>/dev/null
  for _ in $(seq 1 "$STOP_S"); do kill -0 -- "-$SPID" 2>/dev/null || break; sleep 1; done
  if kill -0 -- "-$SPID" 2>/dev/null; then log "SIGKILL to pgid $SPID"; kill -KILL -- "-$SPID" 2>/dev/null; sleep 2; fi
  for _ in $(seq 1 30); do  # the GPU's memory back before the next boot
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    { [ -z "$used" ] || [ "$used" -lt 2048 ]; } && break; sleep 1  # (no nvidia-smi: no wait)
  done
  log "server stopped; GPU memory used ${used:-?} MiB"
  SPID=
}
trap 'stop_server; log "interrupted"; touch "$CKD/DONE"; exit 1' TERM INT

log "capacity_check started; deadline $(deadline) (left $(left) s), CFGS $CFGS"
for cfg in $CFGS; do v=STEPS_$cfg; log "  $cfg: steps ${!v:-}"; done
rm -rf "$RUN"; mkdir -p "$RUN"
if [ -f "$REPO/.gpubundle/tuner-head.tar.gz" ]; then
  tar -xzf "$REPO/.gpubundle/tuner-head.tar.gz" -C "$RUN" \
    && log "tuner: git archive $(cat "$REPO/.gpubundle/tuner-head.commit" 2>/dev/null)"
else
  log "no .gpubundle/tuner-head.tar.gz: nothing to run"; touch "$CKD/DONE"; exit 1
fi

log "waiting for setup and models"
t0=$(date +%s)
until [ -f "$STATE/vllm.ok" ] && [ -f "$STATE/tuner.ok" ] && [ -f "$MODELS/DONE" ]; do
  for f in bundle tuner vllm models; do
    [ -f "$STATE/$f.failed" ] && { log "$f failed"; touch "$CKD/DONE"; exit 1; }
  done
  if [ $(( $(date +%s) - t0 )) -ge "$WAIT_S" ] || [ "$(left)" -le 0 ]; then
    log "setup/models not ready after $(( $(date +%s) - t0 )) s"; touch "$CKD/DONE"; exit 1
  fi
  sleep 2
done
log "ready after $(( $(date +%s) - t0 )) s: $(tail -1 "$STATE/vllm.probe")"

cd "$RUN" || exit 1
export_caches
TUNER=(env "PYTHONPATH=$PYDEPS/tuner:$RUN" "$PY" -m tuner)  # a command, so `timeout` can run it
VLLM=$ENGINES/vllm/bin/python
if timeout 60 "${TUNER[@]}" verify --help > "$CKD/verify_help.txt" 2>&1; then HAVE_VERIFY=1; else HAVE_VERIFY=0; fi
log "tuner verify: $([ $HAVE_VERIFY = 1 ] && echo present || echo absent, falling back to vllm bench serve)"
gen_prompts() {  # the fallback's 2000 distinct prompts, made while the first server boots
  timeout 300 "${TUNER[@]}" workload rag --requests 2000 --seed 0 --model "$MODELS/target" --out "$CKD/custom.jsonl" \
    > "$CKD/workload.log" 2>&1; log "workload: exited $?, $(wc -l < "$CKD/custom.jsonl" 2>/dev/null) lines"
  # vLLM's custom dataset reads a top-level "prompt"; the tuner's lines carry it in "body" (warm-up rows left out)
  "$PY" - "$CKD/custom.jsonl" "$CKD/prompts.jsonl" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
n = 0
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r.get("warmup"):
            continue
        prompt = r["prompt"] if isinstance(r.get("prompt"), str) else r["body"]["prompt"]
        out.write(json.dumps({"prompt": prompt, "output_tokens": r.get("max_tokens", 48)}) + "\n"); n += 1
print(f"prompts.jsonl: {n} prompts")
PY
}
WPID=
if [ "$HAVE_VERIFY" = 0 ]; then gen_prompts & WPID=$!; fi

for cfg in $CFGS; do
  case $cfg in
    defaults) FLAGS=(--max-model-len 8192) ;;
    # the defaults without CUDA graphs and torch.compile: a boot short enough for a lease's last minutes,
    # for what does not depend on them (the prefix-cache hit rate of the workload)
    eager) FLAGS=(--max-model-len 8192 --enforce-eager) ;;
    draft) FLAGS=(--max-model-len 8192 --enable-chunked-prefill --max-num-batched-tokens 2048
                  --gpu-memory-utilization 0.9 --speculative-config
                  "{\"model\": \"$MODELS/draft-2l\", \"num_speculative_tokens\": 3, \"method\": \"draft_model\"}") ;;
    *) log "unknown config $cfg"; continue ;;
  esac
  b=$(budget "$BOOT_S" "$BOOT_MIN_S") || { log "$cfg: skipped, $(left) s left"; continue; }
  log "$cfg: booting: vllm serve ${FLAGS[*]}"
  tb=$(date +%s)
  VLLM_SERVER_DEV_MODE=1 setsid "$VLLM" -m vllm.entrypoints.openai.api_server --model "$MODELS/target" \
    --port "$PORT" "${FLAGS[@]}" > "$CKD/server_$cfg.log" 2>&1 < /dev/null &
  SPID=$!; echo "$SPID" > "$STATE/cc-server.pid"
  up=0
  while [ $(( $(date +%s) - tb )) -lt "$b" ]; do
    kill -0 "$SPID" 2>/dev/null || { log "$cfg: server exited during boot"; tail -5 "$CKD/server_$cfg.log" | tee -a "$LOG"; break; }
    if http GET "$URL/health" > /dev/null 2>&1; then up=1; break; fi
    sleep 2
  done
  if [ "$up" != 1 ]; then log "$cfg: not up after $(( $(date +%s) - tb )) s"; stop_server; continue; fi
  log "$cfg: up after $(( $(date +%s) - tb )) s"
  cap=
  v=STEPS_$cfg
  for step in ${!v:-}; do
    case $step in
      drive[0-9]*) n=${step#drive}
        t=$(budget "$DRIVE_S" "$DRIVE_MIN_S") || { log "$cfg: drive $n skipped, $(left) s left"; continue; }
        log "$cfg: drive $n (timeout $t s)"
        ts=$(date +%s)
        timeout -k 10 "$t" "${TUNER[@]}" drive --url "$URL" --workload rag --model "$MODELS/target" --capacity \
          --tier interactive --json > "$CKD/drive_${cfg}_$n.json" 2> "$CKD/drive_${cfg}_$n.err" &
        DPID=$!
        # the server's running prefix-cache hit rate every SCRAPE_S while the drive runs, so a lease cut
        # mid-drive still brings back the hit rate over what was sent
        ( while kill -0 "$DPID" 2>/dev/null; do
            sleep "$SCRAPE_S"
            http GET "$URL/metrics" > "$CKD/metrics_live.txt" 2>/dev/null \
              && echo "[$(date -u +%T)] during $step: $(hit_rate "$CKD/metrics_live.txt")" >> "$CKD/hit_$cfg.txt"
          done ) &
        wait "$DPID"; rc=$?
        c=$(capacity_of "$CKD/drive_${cfg}_$n.json")
        log "$cfg: drive $n exited $rc after $(( $(date +%s) - ts )) s: interactive capacity ${c:-none}"
        [ "$n" = 1 ] && cap=$c ;;
      verify)
        if [ -z "$cap" ]; then
          log "$cfg: no capacity from drive 1: no verify"; continue
        elif [ "$HAVE_VERIFY" = 1 ]; then
          if t=$(budget "$VERIFY_S" "$VERIFY_MIN_S"); then
            log "$cfg: tuner verify --rate $cap (timeout $t s)"
            ts=$(date +%s)
            timeout -k 10 "$t" "${TUNER[@]}" verify --url "$URL" --workload rag --model "$MODELS/target" --rate "$cap" \
              --tier interactive --engine-env "vllm=$ENGINES/vllm" --out "$CKD/verify_$cfg" --json \
              > "$CKD/verify_$cfg.json" 2> "$CKD/verify_$cfg.err"
            log "$cfg: verify exited $? after $(( $(date +%s) - ts )) s; $(head -c 600 "$CKD/verify_$cfg.json")"
            recount "$CKD/verify_$cfg" >> "$CKD/hit_$cfg.txt" 2>&1
          else log "$cfg: verify skipped, $(left) s left"; continue; fi
        else
          [ -z "$WPID" ] || { wait "$WPID"; WPID=; }
          for f in 1.0 1.2; do
            t=$(budget "$BENCH_S" 60) || { log "$cfg: bench at ${f}x skipped, $(left) s left"; continue; }
            r=$("$PY" -c "print(float('$cap') * $f)"); np=$("$PY" -c "import math; print(math.ceil(30 * $r))")
            http POST "$URL/reset_prefix_cache" > /dev/null 2>&1 && pr=reset || pr="reset FAILED"
            log "$cfg: vllm bench serve at ${f}x = $r req/s, $np prompts (prefix cache $pr; timeout $t s)"
            timeout -k 10 "$t" "$VLLM" -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "$URL" \
              --model "$MODELS/target" --dataset-name custom --dataset-path "$CKD/prompts.jsonl" --skip-chat-template \
              --custom-output-len 512 --ignore-eos --request-rate "$r" --num-prompts "$np" --seed 0 \
              --goodput ttft:"$SLO_TTFT_MS" tpot:"$SLO_TPOT_MS" --save-result --save-detailed --result-dir "$CKD" \
              --result-filename "bench_${cfg}_$f.json" > "$CKD/bench_${cfg}_$f.log" 2>&1
            rc=$?
            log "$cfg: bench at ${f}x exited $rc; $(bench_attainment "$CKD/bench_${cfg}_$f.json" 2>&1 | tail -1)"
          done
        fi ;;
      *) log "$cfg: unknown step $step"; continue ;;
    esac
    http GET "$URL/metrics" > "$CKD/metrics_${cfg}_$step.txt" 2>/dev/null \
      && { h=$(hit_rate "$CKD/metrics_${cfg}_$step.txt"); log "$cfg: prefix cache after $step: $h"
           echo "after $step: $h" >> "$CKD/hit_$cfg.txt"; }
  done
  http GET "$URL/metrics" > "$CKD/metrics_${cfg}_end.txt" 2>/dev/null \
    && { h=$(hit_rate "$CKD/metrics_${cfg}_end.txt"); log "$cfg: prefix cache at the end: $h"
         echo "end: $h" >> "$CKD/hit_$cfg.txt"; }
  stop_server
done
log "done; $(left) s left"
touch "$CKD/DONE"
