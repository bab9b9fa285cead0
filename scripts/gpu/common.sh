# Paths and environment shared by the scripts that run on the H200 machine (sourced, not run).
ROOT=${GPU_ROOT:-/root}
BUNDLE=$ROOT/bundle            # pieces/ as they arrive, wheels/ once unpacked
PYDEPS=$ROOT/pydeps            # one pip --target folder per set: tuner, vllm, sglang
ENGINES=$ROOT/engines          # ENGINE/bin/python wrappers for --engine-env
MODELS=$ROOT/models/h200       # target, draft-2l, draft-1l, eagle3-head, eagle-head, DONE
STATE=$ROOT/state              # markers (*.ok, *.failed), logs of the setup steps, pids
RUN=$ROOT/run                  # the repository snapshot the study runs from
STUDY=$ROOT/study              # rag-h200.db and search.log
CAPTURES=$ROOT/captures        # pynvml samples and /metrics scrapes taken beside the trials
# NVLink multicast stays off (KINDS.md), in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-$(command -v python3)}
mkdir -p "$BUNDLE/pieces" "$BUNDLE/wheels" "$PYDEPS" "$ENGINES" "$STATE" "$STUDY" "$CAPTURES"
