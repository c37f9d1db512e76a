#!/usr/bin/env bash
# Paper appendix G.3, another model family: OctoThinker-3B-Hybrid-Base (Llama 3.2 lineage) on MATH,
# PPO ratio clip vs DPPO binary TV (delta 0.2), with Oat's math-RL example settings (Dr. GRPO: 8
# samples per question, group-mean baseline without std, masked_sum / generate_max_length).
# The questions: GEM's math:Math12K (MATH-derived, downloaded from the hub by the actors) by default;
# MATH_ENV=math MATH_DATA=file.jsonl uses a local file (problem/answer columns) instead.
# 8 GPUs, one node. See docs/gpu.md.
#   bash experiments/paper_g3/math_octothinker.sh [--dry-run] [--arm ppo_clip|dppo_binary_tv] [extra options]
set -euo pipefail
SCRIPT_ARGS=("$@")
source "$(dirname "$0")/common.sh"
ARMS=("${G3_ARMS[@]}")
DATA=()
[ -n "${MATH_DATA:-}" ] && DATA=(--math-data "$MATH_DATA")
BASE=(
  --gpus 8 --collocate --vllm-sleep --vllm-gpu-ratio 0.35 --enable-prefix-caching
  --zero-stage 2 --gradient-checkpointing --flash-attn --bf16
  --model OctoThinker/OctoThinker-3B-Hybrid-Base --template auto
  --env "${MATH_ENV:-math:Math12K}" "${DATA[@]}"
  --critic-type drgrpo --group-size 8 --advantage group
  --rollout-batch-size 128 --rollout-batch-size-per-device 16 --pi-buffer-maxlen-per-device 128
  --train-batch-size 128 --train-batch-size-per-device 1 --num-ppo-epochs 1
  --learning-rate 1e-6 --lr-scheduler constant --beta 0
  --generate-max-length 4096 --max-model-len 8192
  --temperature 1.0 --top-p 1.0 --top-k -1
  --eval-steps 16 --eval-episodes 256 --eval-temperature 0 --save-steps -1 --max-train 9999999
)
run_arms math_octothinker "${BASE[@]}"
