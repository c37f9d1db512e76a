#!/usr/bin/env bash
# Issue 50: more signal per update on GuessTheNumber-easy. Every earlier arm from the noisy-bisect warm start
# took one pass over 32 episodes of 4 hidden numbers (groups of 8) and moved the policy by a binary-TV of
# 0.001-0.008 a token; none learned. This arm doubles the hidden numbers an iteration (64 episodes, 8 groups of
# 8) and takes two passes over each batch (the trust region's job: the second pass is off-policy), at lr 5e-5,
# from the same model (runs/oat_recipe/model, exported by experiments/gtn_warm_start_oat.sh), vLLM 0.32 in
# float32 (rollouts seeded per (seed, turn) since the seeding fix).
#
#   bash experiments/gtn_epochs.sh      # ~2 h on one core; records in OUT
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
MODEL="${MODEL:-runs/oat_recipe/model}"
OUT="${OUT:-runs/gtn_epochs}"
[ -f "$MODEL/config.json" ] || { echo "needs the exported warm start: bash experiments/gtn_warm_start_oat.sh (its first two steps)"; exit 2; }
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main --env game:GuessTheNumber-v0-easy --env-option partial_credit=false \
  --response-prefix '\boxed{' --max-new-tokens 6 --trainable-layers 6 --model "$MODEL" --template chatml \
  --trust-region dppo_binary_tv --episodes-per-iteration 64 --group-size 8 --advantage gigpo \
  --mini-batch-size 64 --micro-batch-size 8 --num-ppo-epochs 2 --learning-rate 5e-5 \
  --iterations 24 --eval-every 8 --eval-episodes 64 --seed 0 --threads 1 --log-episodes 8 --no-progress \
  --engine vllm --engine-dtype float32 --save-every 4 --run-dir "$OUT/epochs2_5e-5" "$@"
