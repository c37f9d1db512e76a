#!/usr/bin/env bash
# Paper section 5 (appendix D) stability sanity test: DeepSeek-R1-Distill-Qwen-1.5B on a curated set
# of 1,460 MATH problems that the initial model can all solve (a stable algorithm reaches ~100%
# training accuracy). 64 questions x 8 responses per iteration, responses up to 8,000 tokens,
# 4 gradient steps per batch, bf16, learning rate 1e-6, GRPO advantages without std (eq. 23).
# The paper ran VeRL; this is the same set-up on Oat. The problem file is yours to provide:
#   SANITY_DATA=math_sanity_1460.jsonl bash experiments/paper_g3/sanity_test.sh [--dry-run] [--arm NAME]
# Arms (appendix D.1): pg_is, cispo (C=3), grpo_clip_higher (ratio pi/mu, eps 0.2/0.28), minirl
# (ratio pi/pi_old), minirl_tis (C=3), dppo_binary_tv (delta 0.15), dppo_binary_kl (delta 0.05).
set -euo pipefail
SCRIPT_ARGS=("$@")
source "$(dirname "$0")/common.sh"
ARMS=(pg_is cispo grpo_clip_higher minirl minirl_tis dppo_binary_tv dppo_binary_kl)
ARM_pg_is=(--trust-region pg_is)
ARM_cispo=(--trust-region cispo --C 3)
ARM_grpo_clip_higher=(--trust-region ppo_clip --eps-low 0.2 --eps-high 0.28)
ARM_minirl=(--trust-region ppo_clip --eps-low 0.2 --eps-high 0.28 --anchor recompute)
ARM_minirl_tis=(--trust-region ppo_clip --eps-low 0.2 --eps-high 0.28 --anchor recompute --C 3)
ARM_dppo_binary_tv=(--trust-region dppo_binary_tv --delta 0.15)
ARM_dppo_binary_kl=(--trust-region dppo_binary_kl --delta 0.05)
BASE=(
  --gpus 8 --collocate --vllm-sleep --vllm-gpu-ratio 0.35 --enable-prefix-caching
  --zero-stage 2 --gradient-checkpointing --bf16
  --model deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B --template tokenizer
  --env math --math-data "${SANITY_DATA:-data/math_sanity_1460.jsonl}"
  --group-size 8 --advantage group --aggregation token_mean
  --rollout-batch-size 64 --rollout-batch-size-per-device 8 --pi-buffer-maxlen-per-device 64
  --train-batch-size 128 --train-batch-size-per-device 1 --num-ppo-epochs 1
  --learning-rate 1e-6 --lr-scheduler constant --lr-warmup-ratio 0 --beta 0
  --generate-max-length 8000 --max-model-len 10240
  --temperature 1.0 --top-p 1.0 --top-k -1
  --eval-steps -1 --save-steps -1 --max-train 9999999
)
run_arms sanity_test "${BASE[@]}"
