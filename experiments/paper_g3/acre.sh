#!/usr/bin/env bash
# Paper appendix G.3, induction: Qwen3-1.7B-Base on reasoning-gym's ACRE (GEM rg:acre, single turn),
# PPO ratio clip vs DPPO binary TV (delta 0.2). GEM's Oat settings for reasoning-gym (gamma 1).
# 8 GPUs, one node. See docs/gpu.md.
#   bash experiments/paper_g3/acre.sh [--dry-run] [--arm ppo_clip|dppo_binary_tv] [extra options]
set -euo pipefail
SCRIPT_ARGS=("$@")
source "$(dirname "$0")/common.sh"
ARMS=("${G3_ARMS[@]}")
BASE=("${GEM_OAT[@]}" --env rg:acre --gamma 1.0)
run_arms acre "${BASE[@]}"
