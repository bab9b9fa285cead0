#!/usr/bin/env bash
# The setup daemon on the H200 machine (started once by recv.sh; runs from $STATE/scripts).
# As the pieces of a set arrive (bundle.sha256 lists them), it checks, unpacks and installs:
#   a.* = the tuner's dependencies + vLLM 0.26.0's wheels; b.* = SGLang 0.5.17's other wheels.
# Each set goes to its own folder with pip --no-index --no-deps --target (their pins conflict),
# and each engine gets a wrapper $ENGINES/ENGINE/bin/python that sets PYTHONPATH to its folder
# alone and execs the image's python3 (whose torch a --system-site-packages venv cannot see).
# SETUP_ENGINES (default vllm,sglang): with vllm alone, SGLang is not installed (setup.done still comes).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
log() { echo "[$(date +%T)] $*"; }

feed() {  # every piece in order as it arrives, checked, to stdout (then deleted)
  local name sum
  while read -r sum name; do
    while [ ! -f "$BUNDLE/pieces/$name" ]; do sleep 1; done
    sleep 0.5  # a piece is moved in whole (mv within one file system), but be safe
    if [ "$(sha256sum < "$BUNDLE/pieces/$name" | cut -d' ' -f1)" != "$sum" ]; then
      log "piece $name: checksum failed" >&2; touch "$STATE/bundle.failed"; return 1
    fi
    cat "$BUNDLE/pieces/$name" && rm -f "$BUNDLE/pieces/$name"
    log "piece $name unpacking" >&2
  done < "$HERE/bundle.sha256"
}

wait_marker() {  # A.DONE follows the tuner's and vLLM's wheels in the stream, B.DONE SGLang's
  while [ ! -f "$BUNDLE/wheels/$1.DONE" ]; do
    [ -f "$STATE/bundle.failed" ] && exit 1
    sleep 1
  done
  log "set $1 unpacked: $(ls "$BUNDLE/wheels" | wc -l) files"
}

install() {  # install() NAME: the wheels named in wheels-NAME.txt into $PYDEPS/NAME
  local t0; t0=$(date +%s)
  rm -rf "$PYDEPS/$1"
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PYDEPS/$1" \
      $(sed "s|^|$BUNDLE/wheels/|" "$HERE/wheels-$1.txt") > "$STATE/pip-$1.log" 2>&1; then
    log "installed $1 in $(( $(date +%s) - t0 )) s ($(du -sh "$PYDEPS/$1" | cut -f1))"
  else
    log "install $1 failed"; tail -5 "$STATE/pip-$1.log"; touch "$STATE/$1.failed"; return 1
  fi
}

wrapper() {  # wrapper ENGINE: $ENGINES/ENGINE/bin/python
  mkdir -p "$ENGINES/$1/bin"
  cat > "$ENGINES/$1/bin/python" <<WRAP
#!/bin/sh
# $1 from $PYDEPS/$1 on the image's python3 and torch (scripts/gpu/setup.sh)
export PYTHONPATH=$PYDEPS/$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
exec $PY "\$@"
WRAP
  chmod +x "$ENGINES/$1/bin/python"
}

probe() {  # probe ENGINE MODULE: import it with its wrapper, record the versions
  local t0; t0=$(date +%s)
  if "$ENGINES/$1/bin/python" -c "import $2, torch, transformers, sys; print('$1', $2.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" > "$STATE/$1.probe" 2>&1; then
    log "$(tail -1 "$STATE/$1.probe") (import $(( $(date +%s) - t0 )) s)"; touch "$STATE/$1.ok"
  else
    log "import $2 failed:"; tail -8 "$STATE/$1.probe"; touch "$STATE/$1.failed"
  fi
}

log "setup started; python3 is $PY"
( feed | tar -x -C "$BUNDLE/wheels" || touch "$STATE/bundle.failed" ) &
wait_marker A
install tuner & p1=$!
install vllm & p2=$!
wait $p1 && PYTHONPATH="$PYDEPS/tuner" "$PY" -c "import optuna, pydantic, sqlalchemy, httpx, yaml, psutil, tokenizers, pynvml, numpy, plotly; print('tuner deps: optuna', optuna.__version__, 'plotly', plotly.__version__, 'pydantic', pydantic.__version__, 'sqlalchemy', sqlalchemy.__version__, 'tokenizers', tokenizers.__version__)" > "$STATE/tuner.probe" 2>&1 \
  && { log "$(cat "$STATE/tuner.probe")"; touch "$STATE/tuner.ok"; } || { log "tuner deps failed"; cat "$STATE/tuner.probe"; touch "$STATE/tuner.failed"; }
wait $p2 && { wrapper vllm; probe vllm vllm; }
wait_marker B
# SETUP_ENGINES=vllm (inherited from recv.sh's caller) skips SGLang, for a bundle made without its set
case ",${SETUP_ENGINES:-vllm,sglang}," in
  *,sglang,*) install sglang && { wrapper sglang; probe sglang sglang; } ;;
  *) log "sglang skipped (SETUP_ENGINES=$SETUP_ENGINES)" ;;
esac
touch "$STATE/setup.done"
log "setup done"
