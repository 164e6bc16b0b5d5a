#!/usr/bin/env bash
# Serve Kimi K2.6 with DDTREE speculative decoding and its DFlash drafter (README.md beside this).
#
#   HW=h200 bash docker/kimi-k2.6/launch.sh            # 8x H200 (141 GB each)
#   HW=b300 PORT=8000 bash docker/kimi-k2.6/launch.sh  # 8x B300 (288 GB each)
#   DRY_RUN=1 bash docker/kimi-k2.6/launch.sh          # print the command, one argument a line
#
# Env: MODEL (default moonshotai/Kimi-K2.6), DRAFT (default z-lab/Kimi-K2.6-DFlash), HW (h200 |
# b300, default h200), PORT (default 30000), MEM_FRACTION_STATIC (overrides the HW default),
# ATTENTION (flashmla | triton; default flashmla on h200, triton on b300; flashmla: H200 only,
# page size 64).
# Extra arguments are passed on to sglang.launch_server unchanged.
set -euo pipefail

MODEL="${MODEL:-moonshotai/Kimi-K2.6}"
DRAFT="${DRAFT:-z-lab/Kimi-K2.6-DFlash}"
HW="${HW:-h200}"
PORT="${PORT:-30000}"

# Fraction of each GPU's memory for weights + KV cache. Starting points, not tuned values: at
# TP 8 each GPU holds roughly 75 GB of weights, the rest of the fraction becomes KV cache, and
# what is left outside it holds activations, CUDA graphs and the triton MLA kernel's buffers.
# Lower it on out-of-memory at startup or under load.
# ATTENTION's default: flashmla at page size 64 on Hopper, the backend the DFLASH chain runs
# K2.6 on, where DDTREE's step is within 1.10x the chain's and 1.6-3.3x faster than on triton
# at 16K-64K tokens (README.md); triton at page size 1 on B300 (FlashMLA's kernel is Hopper's).
case "$HW" in
  h200) default_mem=0.85 default_attention=flashmla ;;  # 141 GB a GPU
  b300) default_mem=0.9 default_attention=triton ;;     # 288 GB a GPU
  *)
    echo "launch.sh: HW must be h200 or b300, not '$HW'" >&2
    exit 2
    ;;
esac
MEM="${MEM_FRACTION_STATIC:-$default_mem}"

ATTENTION="${ATTENTION:-$default_attention}"
case "$ATTENTION" in
  triton) page=1 ;;
  flashmla)
    page=64
    if [[ "$HW" != h200 ]]; then
      echo "launch.sh: ATTENTION=flashmla runs FlashMLA's Hopper kernel: use it with HW=h200" >&2
      exit 2
    fi
    ;;
  *)
    echo "launch.sh: ATTENTION must be triton or flashmla, not '$ATTENTION'" >&2
    exit 2
    ;;
esac

# No --speculative-num-draft-tokens: DDTREE's default tree budget applies (for a mixture-of-
# experts target such as K2.6, W = the drafter's block at every batch size).
# --cuda-graph-max-bs-decode 128: SGLang's default at TP 8 on these GPUs is 512, for which
# DDTREE would capture its glue graphs for every batch size up to 512 at startup, holding
# float32 probabilities of 512 x 8 rows x 163,840 tokens a few times over on every GPU
# (README.md). Larger batches still run, without CUDA graphs; pass a larger value to capture
# more.
cmd=(
  python3 -m sglang.launch_server
  --model-path "$MODEL"
  --speculative-algorithm DDTREE
  --speculative-draft-model-path "$DRAFT"
  --tp 8
  --attention-backend "$ATTENTION"
  --page-size "$page"
  --cuda-graph-max-bs-decode 128
  --mem-fraction-static "$MEM"
  --trust-remote-code
  --reasoning-parser kimi_k2
  --tool-call-parser kimi_k2
  --host 0.0.0.0
  --port "$PORT"
  "$@"
)

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%s\n' "${cmd[@]}"
  exit 0
fi
exec "${cmd[@]}"
