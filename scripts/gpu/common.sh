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
# The engines' compile caches (vLLM's torch.compile, inductor, triton, flashinfer/deep_gemm JIT), where
# study.sh and capacity_check.sh point them. A study's blocks carry them from one to the next
# (poll.sh packs them, begin.sh unpacks them): a block's first boot of vLLM otherwise compiles what
# the block before compiled, and a cold boot took far longer than the next boot on the same machine
# (reports/gpu-h100/study-1/block12/NOTES.md, "The repeats of vLLM's defaults").
CACHE=$STATE/cache
# Every cache folder the engines write, under $CACHE (study.sh and capacity_check.sh call this before
# a boot). XDG_CACHE_HOME covers the libraries that follow it (FlashInfer's JIT among them); SGLang
# 0.5.17 does not: it builds its JIT kernels with tvm-ffi into TVM_FFI_CACHE_DIR (default
# ~/.cache/tvm-ffi, sglang/kernels/jit/utils/compile.py) and keeps its own caches in SGLANG_CACHE_DIR
# (default ~/.cache/sglang, sglang/srt/environ.py); 0.5.23 builds them into SGLANG_JIT_CACHE_DIR
# (default ~/.cache/sglang/jit, sglang/kernels/jit/utils/compile/cache.py). Without them a block's
# first SGLang boot waited with the GPU idle where its second did not, and the pack held nothing of
# SGLang's: most likely those builds (reports/gpu-h100/study-1/block15/NOTES.md, "Boots").
export_caches() {
  mkdir -p "$CACHE"
  export XDG_CACHE_HOME=$CACHE VLLM_CACHE_ROOT=$CACHE/vllm TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor \
    TRITON_CACHE_DIR=$CACHE/triton FLASHINFER_WORKSPACE_BASE=$CACHE \
    TVM_FFI_CACHE_DIR=$CACHE/tvm-ffi SGLANG_CACHE_DIR=$CACHE/sglang SGLANG_JIT_CACHE_DIR=$CACHE/sglang/jit
}
# The packed caches of one study (STUDY_NAME): .gpubundle/ holds it here, $OUT its parts on the way back.
cache_pack() { echo "engine-cache-$1.tar.gz"; }
. "$(dirname "${BASH_SOURCE[0]}")/stages.sh"  # the studies' two stages: their tags, settings, archives
# NVLink multicast stays off (KINDS.md), in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PY:-$(command -v python3)}
mkdir -p "$BUNDLE/pieces" "$BUNDLE/wheels" "$PYDEPS" "$ENGINES" "$STATE" "$STUDY" "$CAPTURES"
# A block's later calls (pieces, polls, finish) must reach the machine that ran its call 1
# (begin.sh), which wrote $STATE/lease.start. When that machine goes away mid-block, the next call
# gets a bare one: there these calls answer BARE at once, rather than start a setup no tag archive
# came with or wait out a poll on a study that is not there (in the H100 study's block 2 five polls
# spent the rest of a lease that way: reports/gpu-h100/study-1/block2/NOTES.md), so the
# message ends and what is left of the budget can carry the block again from call 1.
require_block() {
  if [ ! -f "$STATE/lease.start" ]; then
    echo "BARE: no $STATE/lease.start, so this is not the machine that ran the block's call 1 (that one went away); nothing done. Send the block again from call 1 with T cut to the budget left."
    exit 3
  fi
}
# The block's search, started in the background from the scripts' copy (a running bash script must not
# be rewritten by the next call's sync), with the block's stage (begin.sh's block.env) and the study's
# 18 trials; its output appended to study.log. Arguments: the seconds after which no trial may start,
# then NAME=VALUE settings for study.sh (STUDY_NAME, and STUDY_DB where the file is to be copied in).
STUDY_TRIALS=18  # each study's booted trials before its finalists (the RUNBOOK's "--trials 18")
start_study() {
  ( . "$STATE/block.env"; exec env "${@:2}" setsid nohup bash "$STATE/study-scripts/study.sh" "$1" "$STUDY_TRIALS" \
      >> "$STATE/study.log" 2>&1 < /dev/null ) &
}
