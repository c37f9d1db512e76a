# Shared by the paper_g3 launch scripts (sourced, not run). Each script defines its environment,
# model and arms, then calls `run_arms NAME "${BASE[@]}"`.
#
# Script options (before anything else; the rest goes to every arm's command line):
#   --dry-run        print each arm's command and its resolved configuration, launch nothing (no GPU)
#   --arm NAME       run only this arm (repeatable); default: every arm of the script, one after another
# Environment: PYTHON (default: python), OUT (default: runs/paper_g3), WANDB=1 to log to Weights & Biases.

PYTHON="${PYTHON:-python}"
OUT="${OUT:-runs/paper_g3}"

# GEM's Oat example settings for Qwen3-1.7B-Base on games and reasoning-gym (gem README,
# "Training with Oat": one node, 8 GPUs, actors and learners collocated, vLLM asleep while learning).
GEM_OAT=(
  --gpus 8 --collocate --vllm-sleep --vllm-gpu-ratio 0.45 --enable-prefix-caching
  --zero-stage 2 --gradient-checkpointing --bf16
  --model Qwen/Qwen3-1.7B-Base --template qwen3
  --group-size 1 --advantage batch_norm
  --rollout-batch-size 128 --rollout-batch-size-per-device 16 --pi-buffer-maxlen-per-device 16
  --train-batch-size 128 --train-batch-size-per-device 1 --num-ppo-epochs 2
  --learning-rate 1e-6 --lr-scheduler constant --lr-warmup-ratio 0 --beta 0
  --max-model-len 12800 --generate-max-length 4096
  --temperature 1.0 --top-p 1.0 --top-k -1
  --eval-steps -1 --save-steps -1 --max-train 65000
)

# Paper G.3 arms: the ratio clip vs the binary-TV divergence mask, both anchored on mu (GRPO
# framework, the trust region the only difference), TV threshold 0.2. ARM_<name> holds its options.
G3_ARMS=(ppo_clip dppo_binary_tv)
ARM_ppo_clip=(--trust-region ppo_clip --cliprange 0.2)
ARM_dppo_binary_tv=(--trust-region dppo_binary_tv --delta 0.2)

run_arms() {
  local name="$1"; shift
  local base=("$@")
  local dry=0 arms=() extra=()
  while [ "${#SCRIPT_ARGS[@]}" -gt 0 ]; do
    case "${SCRIPT_ARGS[0]}" in
      --dry-run) dry=1; SCRIPT_ARGS=("${SCRIPT_ARGS[@]:1}") ;;
      --arm) arms+=("${SCRIPT_ARGS[1]}"); SCRIPT_ARGS=("${SCRIPT_ARGS[@]:2}") ;;
      *) extra=("${SCRIPT_ARGS[@]}"); SCRIPT_ARGS=() ;;
    esac
  done
  [ "${#arms[@]}" -gt 0 ] || arms=("${ARMS[@]}")
  local wandb=()
  [ "${WANDB:-0}" = 1 ] && wandb=(--use-wb --wb-project oat_dppo_paper_g3)
  local arm
  for arm in "${arms[@]}"; do
    local var="ARM_${arm}[@]"
    if ! declare -p "ARM_${arm}" >/dev/null 2>&1; then
      echo "unknown arm '$arm'; this script has: ${ARMS[*]}" >&2
      return 2
    fi
    local cmd=("${base[@]}" "${!var}" --wb-run-name "${name}-${arm}" --save-path "${OUT}/${name}-${arm}"
               "${wandb[@]}" "${extra[@]}")
    if [ "$dry" = 1 ]; then
      echo "# ${name} / ${arm}: ${PYTHON} -m oat_dppo.main --backend oat ${cmd[*]}"
      "${PYTHON}" -m oat_dppo.main --backend oat --print-config "${cmd[@]}"
    else
      echo "=== ${name} / ${arm}" >&2
      "${PYTHON}" -m oat_dppo.main --backend oat "${cmd[@]}"
    fi
  done
}
