#!/usr/bin/env bash
# Issue 50: more signal per update on GuessTheNumber-easy. Every earlier arm from the noisy-bisect warm start
# took one pass over 32 episodes of 4 hidden numbers (groups of 8) and moved the policy by a binary-TV of
# 0.001-0.008 a token; none learned. This arm doubles the hidden numbers an iteration (64 episodes, 8 groups of
# 8) and takes two passes over each batch (the trust region's job: the second pass is off-policy), at lr 5e-5,
# from the same model (runs/oat_recipe/model, exported by experiments/gtn_warm_start_oat.sh), vLLM 0.32 in
# float32 (rollouts seeded per (seed, turn) since the seeding fix).
#
# Arm B (ARM=group_norm_1e-4): `benchmarks credit-signal` puts gigpo's signal for reading at about half of
# group_norm's per batch (signal/noise 0.8 against 1.4 at q = 0.7), and the arms so far moved the policy by a
# binary-TV of <= 0.008 an iteration: group_norm, lr 1e-4, optimizer steps of 16 turns (~12 an iteration), 1 pass.
#
#   bash experiments/gtn_epochs.sh                    # arm A, ~2 h on one core; records in OUT
#   ARM=group_norm_1e-4 bash experiments/gtn_epochs.sh   # arm B
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
MODEL="${MODEL:-runs/oat_recipe/model}"
OUT="${OUT:-runs/gtn_epochs}"
[ -f "$MODEL/config.json" ] || { echo "needs the exported warm start: bash experiments/gtn_warm_start_oat.sh (its first two steps)"; exit 2; }
ARM="${ARM:-epochs2_5e-5}"
case "$ARM" in
  epochs2_5e-5) OPTS=(--advantage gigpo --mini-batch-size 64 --num-ppo-epochs 2 --learning-rate 5e-5 --iterations 24
                      --eval-every 8) ;;
  group_norm_1e-4) OPTS=(--advantage group_norm --mini-batch-size 16 --num-ppo-epochs 1 --learning-rate 1e-4
                         --iterations 20 --eval-every 10) ;;
  *) echo "ARM: epochs2_5e-5 or group_norm_1e-4"; exit 2 ;;
esac
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main --env game:GuessTheNumber-v0-easy --env-option partial_credit=false \
  --response-prefix '\boxed{' --max-new-tokens 6 --trainable-layers 6 --model "$MODEL" --template chatml \
  --trust-region dppo_binary_tv --episodes-per-iteration 64 --group-size 8 "${OPTS[@]}" --micro-batch-size 8 \
  --eval-episodes 64 --seed 0 --threads 1 --log-episodes 8 --no-progress \
  --engine vllm --engine-dtype float32 --save-every 4 --run-dir "$OUT/$ARM" "$@"
