#!/usr/bin/env bash
# Oat's own program on the lent GPU (issue 36, part 6): `python -m oat_dppo.main --backend oat` with Oat
# 0.2.4's stack from the offline kit (setup/oat_gpu_kit.sh, installed by setup/oat_gpu_install.sh), one
# vLLM 0.8.4 actor and one DeepSpeed learner sharing the one GPU, SmolLM2 on GuessTheNumber, the sync
# check on. setup/gpu_window.sh runs it first in a window, with the seconds it may take; it also runs alone.
#
#   usage: setup/oat_gpu_window.sh [SECONDS]       (default 420; run from the checkout's root)
#          DRY_RUN=1 setup/oat_gpu_window.sh      prints what it would run (and, where a Python with Oat
#                                                 is here, the configuration Oat would get); runs nothing
#   env:   OAT_KIT      the kit's directory (default ~/oatkit): KIT/venv, or its parts, installed first
#          ITERATIONS   learning rounds (default 5; the issue asks for at least 3)
#          STEP_OUT     where this step's log, summary and the run's small files go (gpu_window.sh sets it)
#          OUT          the archive lands here: $OUT/oat_gpu_window.tar.gz (the device tool's $OUT)
#
# Exit status: the program's (0: every round ran; 124/143: the time limit stopped it), 3 when there is
# no kit here (one line says so; the window goes on with its next step).
#
# Choices, each forced by one GPU or by the kit:
# - One GPU for both: Oat's get_program (oat/interface.py) gives the actor GPUs [0] and the learner GPUs
#   [0] for --gpus 1, collocated or not. Without --collocate the weight broadcast is NCCL between two
#   processes on the same device, which NCCL refuses (Oat's WorkerWrap says so: "nccl will report error
#   when two processes are on the same device"). --collocate is Oat's answer: the broadcast goes over
#   gloo (CUDA tensors staged through host memory), the learner's own collectives stay NCCL (one rank).
#   So this run checks NCCL only as DeepSpeed's one-rank group; an NCCL broadcast needs two GPUs.
# - --vllm-gpu-ratio 0.2: vLLM's share of the whole GPU (16 GB on an H100: SmolLM2's weights are 0.3 GB,
#   the rest is KV cache); the learner takes what it needs beside it.
# - --dtype bfloat16: vLLM 0.8.4 runs its V1 engine in bf16 (float32 falls back to V0); the V1 engine is
#   what this run is for. --check-sync on: after every sync, the actor's log-probs of one response
#   against the learner's, and a digest of the actor's weights (sync/... in metrics.jsonl).
# - --no-flash-attn: flash-attn has no wheel (an sdist needing nvcc), so it is not in the kit.
# - The optimizer: Oat's is DeepSpeed's FusedAdam, JIT-compiled with nvcc on first use; FusedAdam has no
#   fallback. Where a CUDA 12 nvcc is found (CUDA_HOME, PATH, /usr/local/cuda-12*), that runs (built
#   once into TORCH_EXTENSIONS_DIR for sm_90). Elsewhere --adam-offload: DeepSpeedCPUAdam, which the kit's
#   DeepSpeed wheel carries prebuilt (ZeRO-2 keeps the fp32 master weights and Adam's moments in host
#   memory, the step on the CPU: for 135M parameters a fraction of a second, estimated).
# - vLLM's engine core in its own process, as Oat runs it on GPUs: gpu_window.sh's
#   VLLM_ENABLE_V1_MULTIPROCESSING=0 (for the local backend's in-process engine) is unset here.
set -u
BUDGET=${1:-420}
DRY=${DRY_RUN:-0}
KIT=${OAT_KIT:-$HOME/oatkit}
ITERATIONS=${ITERATIONS:-5}
W=${STEP_OUT:-runs/oat_gpu_window}
OUTDIR=${OUT:-runs/oat_gpu_window_out}
STAMP=$(date -u +%Y%m%dT%H%M%S)
RUN=runs/oat_gpu/$STAMP           # the run's own directory (checkpoints stay here; only small files travel)
PY=$KIT/venv/bin/python
start=$(date +%s)
say() { echo "[oat-gpu +$(( $(date +%s) - start ))s] $*"; }
[ -d oat_dppo ] || { echo "run from the checkout's root" >&2; exit 2; }

# The optimizer, from the nvcc this machine has (see above).
nvcc_release() {  # prints e.g. 12.4 for the first nvcc found, nothing if none
  local c
  for c in "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "$(command -v nvcc || true)" /usr/local/cuda-12*/bin/nvcc /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    "$c" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1 '"${c//\//\\/}"'/p' | head -1 && return
  done
}
read -r NVCC_VER NVCC_PATH < <(nvcc_release; echo) || true
if [ "${NVCC_VER%%.*}" = 12 ]; then
  OPTIMIZER=(); OPT_NOTE="FusedAdam (Oat's default; JIT-built with nvcc $NVCC_VER at $NVCC_PATH)"
else
  OPTIMIZER=(--adam-offload)
  OPT_NOTE="DeepSpeedCPUAdam via --adam-offload (prebuilt in the kit; nvcc: ${NVCC_VER:-none} ${NVCC_PATH:-},"
  OPT_NOTE+=" FusedAdam needs CUDA 12's)"
fi

CMD=("$PY" -m oat_dppo.main --backend oat
     --env game:GuessTheNumber-v0-easy --model smollm2 --dtype bfloat16
     --gpus 1 --collocate --vllm-gpu-ratio 0.2 --check-sync on --no-flash-attn "${OPTIMIZER[@]}"
     --response-prefix '\boxed{' --max-new-tokens 6 --episodes-per-iteration 16 --group-size 4
     --train-batch-size 16 --train-batch-size-per-device 8 --learning-rate 3e-5
     --iterations "$ITERATIONS" --eval-episodes 8 --run-dir "$RUN")
LIMIT=$(( BUDGET - 30 ))          # the program's own time limit: 30 s are kept for the summary and archive
[ "$LIMIT" -ge 60 ] || { echo "oat-gpu: ${BUDGET} s is too little (vLLM's start alone takes about a minute)" >&2; exit 2; }

if [ "$DRY" = 1 ]; then
  if [ -x "$PY" ]; then state=installed
  elif ls "$KIT"/chunk.* "$KIT"/python.tar.gz >/dev/null 2>&1; then state="parts only: would install them first"
  else state="absent: would exit 3"; fi
  echo "kit: $KIT ($state)"
  echo "optimizer: $OPT_NOTE"
  echo "would run, for at most $LIMIT s (SIGTERM, then SIGKILL 30 s later):"
  echo "  $(printf '%q ' "${CMD[@]}")"
  echo "and pack $W (log, summary, the run's config.json / metrics.jsonl) into $OUTDIR/oat_gpu_window.tar.gz"
  # Where a Python with Oat is here (the kit's, or .venv-oat), the configuration Oat would get.
  for p in "$PY" .venv-oat/bin/python; do
    if [ -x "$p" ]; then
      echo "resolved by $p (--print-config; no GPU needed):"
      "$p" -m oat_dppo.main --print-config "${CMD[@]:3}" 2>/dev/null \
        | grep -E '^# (note|learners)|^(gpus|collocate|vllm_gpu_ratio|bf16|check_sync|flash_attn|adam_offload|zero_stage|iterations) =' \
        | sed 's/^/  /'
      break
    fi
  done
  exit 0
fi

mkdir -p "$W" "$OUTDIR"
exec > >(tee -a "$W/oat_gpu_window.txt") 2>&1
say "budget ${BUDGET} s; kit $KIT; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"

# The kit: installed by the transfer recipe's last call (docs/gpu.md); installed here if only its parts
# arrived; absent -> one line and status 3, so that a window without the kit loses seconds, not minutes.
if [ ! -x "$PY" ]; then
  if ls "$KIT"/chunk.* "$KIT"/python.tar.gz >/dev/null 2>&1; then
    say "installing the kit from its parts"
    bash setup/oat_gpu_install.sh "$KIT" > "$W/install.log" 2>&1 || { say "install failed: $(tail -3 "$W/install.log")"; exit 1; }
    say "$(tail -1 "$W/install.log")"
  else
    say "no Oat kit at $KIT (docs/gpu.md, \"Oat's own stack on the GPU\"): skipped"
    exit 3
  fi
fi
# This call's checkout is the project the nodes import (the checkout is laid anew on every call).
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$SITE/oat_dppo_checkout.pth"

say "optimizer: $OPT_NOTE"
export HF_HUB_OFFLINE=1 USE_TF=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/oat_gpu_torch_extensions}
if [ -n "${NVCC_PATH:-}" ] && [ "${NVCC_VER%%.*}" = 12 ]; then   # FusedAdam's JIT build: this toolkit, H100/H200
  export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC_PATH")")} TORCH_CUDA_ARCH_LIST=9.0
fi
unset VLLM_ENABLE_V1_MULTIPROCESSING
say "running for at most ${LIMIT} s: $(printf '%q ' "${CMD[@]}")"
t0=$(date +%s)
timeout -s TERM -k 30 "$LIMIT" "${CMD[@]}" > "$W/oat_gpu.log" 2>&1
rc=$?
say "program exit $rc after $(( $(date +%s) - t0 )) s (0: done; 124: our time limit; 143: SIGTERM)"

# What came back: rounds, the sync check, timings (from metrics.jsonl), one line each, into summary.txt.
mkdir -p "$W/run"
find "$RUN" \( -name config.json -o -name metrics.jsonl -o -name '*.log' \) -size -4M -exec cp --parents {} "$W/run/" \; 2>/dev/null
"$PY" - "$RUN" "$rc" "$OPT_NOTE" > "$W/summary.txt" 2>&1 <<'PY'
import glob, json, sys
run, rc, opt = sys.argv[1:]
rows = [json.loads(l) for f in glob.glob(f"{run}/**/metrics.jsonl", recursive=True) for l in open(f) if l.strip()]
print(f"exit {rc}; optimizer: {opt}; rows in metrics.jsonl: {len(rows)}")
for r in rows:
    keys = ("rollout/reward_mean", "sync/logp_max_abs_diff_before", "sync/logp_max_abs_diff_after",
            "sync/actor_weights_changed", "rollout/generate_time", "train/learn_batch_time",
            "misc/weight_sync_elapse", "misc/elapse")
    print("  round", r.get("iteration", "?"), " ".join(f"{k}={r[k]:.4g}" for k in keys if isinstance(r.get(k), (int, float))))
PY
cat "$W/summary.txt"
tail -n 20 "$W/oat_gpu.log" > "$W/oat_gpu_tail.txt"
tar -czf "$OUTDIR/oat_gpu_window.tar.gz" "$W" 2>/dev/null && say "archive: $OUTDIR/oat_gpu_window.tar.gz ($(du -h "$OUTDIR/oat_gpu_window.tar.gz" | cut -f1))"
exit "$rc"
