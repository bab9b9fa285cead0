#!/usr/bin/env bash
# One screen of where the machine stands: pieces, installs, models, study, GPU memory.
. "$(dirname "$0")/common.sh"
echo "pieces: $(ls "$BUNDLE/pieces" 2>/dev/null | tr '\n' ' ')"
echo "markers: $(cd "$STATE" && ls *.ok *.failed *.done 2>/dev/null | tr '\n' ' ')"
[ -f "$MODELS/DONE" ] && echo "models: $(tail -1 "$STATE/models.log") $(du -sh "$MODELS" | cut -f1)" \
  || { echo "models: not yet"; tail -3 "$STATE/models.log" 2>/dev/null; }
echo "--- setup.log"; tail -6 "$STATE/setup.log" 2>/dev/null
if [ -f "$STUDY/search.log" ]; then echo "--- search.log"; tail -15 "$STUDY/search.log"; fi
NAME=$(cat "$STATE/study.name" 2>/dev/null || echo "${STUDY_NAME:-rag-h200-capacity}")
if [ -f "$STUDY/$NAME.db" ]; then  # one line a trial: state, values, engine, boot, capacity per tier
  echo "--- $NAME.db"
  "$PY" - "$STUDY/$NAME.db" <<'PY' 2>&1 | tail -20
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for tid, num, state in db.execute("select trial_id, number, state from trials order by number"):
    vals = [round(v, 2) for (v,) in db.execute("select value from trial_values where trial_id=? order by objective", (tid,))]
    ua = {k: json.loads(v) for k, v in db.execute("select key, value_json from trial_user_attributes where trial_id=?", (tid,))}
    c = ua.get("capacity") or {}
    caps = {t: ua.get(f"capacity_{t}_req_s") for t in ("interactive", "relaxed")}
    peak = ua.get("peak_memory_bytes")
    print(num, state, vals, ua.get("engine"), ua.get("config"), "boot", ua.get("boot_s"), "cap", caps,
          "steps", c.get("steps_measured"), "search_s", c.get("search_s"),
          "peak_GiB", None if peak is None else round(peak / 2**30, 1), "fail", ua.get("failure"))
PY
fi
du -sh "$STATE/cache" 2>/dev/null
nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv,noheader 2>/dev/null
df -h "$ROOT" | tail -1
