#!/usr/bin/env bash
# Paper appendix G.3, abstract reasoning: Qwen3-1.7B-Base on reasoning-gym's arc_1d (GEM rg:arc_1d,
# single turn), PPO ratio clip vs DPPO binary TV (delta 0.2). GEM's Oat settings for reasoning-gym
# (gamma 1). 8 GPUs, one node. See docs/gpu.md.
#   bash experiments/paper_g3/arc1d.sh [--dry-run] [--arm ppo_clip|dppo_binary_tv] [extra options]
set -euo pipefail
SCRIPT_ARGS=("$@")
source "$(dirname "$0")/common.sh"
ARMS=("${G3_ARMS[@]}")
BASE=("${GEM_OAT[@]}" --env rg:arc_1d --gamma 1.0)
run_arms arc1d "${BASE[@]}"
