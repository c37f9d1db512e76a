#!/usr/bin/env bash
# Paper appendix G.3, multi-turn reasoning: Qwen3-1.7B-Base on GEM's game:Sudoku-v0-easy (4x4,
# one move per turn; every turn is a transition), PPO ratio clip vs DPPO binary TV (delta 0.2).
# GEM's Oat settings for games (gamma 0.9). 8 GPUs, one node. See docs/gpu.md.
#   bash experiments/paper_g3/sudoku.sh [--dry-run] [--arm ppo_clip|dppo_binary_tv] [extra options]
set -euo pipefail
SCRIPT_ARGS=("$@")
source "$(dirname "$0")/common.sh"
ARMS=("${G3_ARMS[@]}")
BASE=("${GEM_OAT[@]}" --env game:Sudoku-v0-easy --gamma 0.9)
run_arms sudoku "${BASE[@]}"
