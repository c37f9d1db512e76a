#!/usr/bin/env bash
# Issue 50: does weighing every episode the same (--episode-balance) stop RL from pushing a GuessTheNumber
# warm start's sampled guesses down on balance? Two arms from one model: the noisy-bisect warm start of
# experiments/gtn_warm_start_oat.sh (MODEL, exported), DPPO binary-TV at lr 5e-5 (the rate at which the TOML's arm
# lost its reading), gigpo, no partial credit, 32 episodes in groups of 8, top 6 layers, 12 iterations, held out
# at -1, 5 and 11 (64 episodes). The HF engine (no seeded-vLLM dependence; float32: mu = pi).
#
#   bash experiments/gtn_episode_balance.sh     # both arms at once, ~80 min on 2 cores; records in OUT
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
MODEL="${MODEL:-runs/oat_recipe/model}"
OUT="${OUT:-runs/gtn_episode_balance}"
[ -f "$MODEL/config.json" ] || { echo "needs the exported warm start: bash experiments/gtn_warm_start_oat.sh (its first two steps)"; exit 2; }
COMMON=(--env game:GuessTheNumber-v0-easy --env-option partial_credit=false --response-prefix '\boxed{'
        --max-new-tokens 6 --trainable-layers 6 --model "$MODEL" --template chatml --trust-region dppo_binary_tv
        --episodes-per-iteration 32 --group-size 8 --advantage gigpo --mini-batch-size 32 --micro-batch-size 8
        --iterations 12 --eval-every 6 --eval-episodes 64 --seed 0 --threads 1 --log-episodes 4 --no-progress
        --engine hf --engine-dtype float32 --learning-rate 5e-5)
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main "${COMMON[@]}" --run-dir "$OUT/plain_5e-5" &
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main "${COMMON[@]}" --episode-balance --run-dir "$OUT/balance_5e-5" &
wait
