#!/usr/bin/env bash
# Issue 50 part 5: the GuessTheNumber recipe of experiments/gtn_warm_start.toml on --backend oat.
# Oat cannot warm-start (its learner has no supervised phase), so the warm start runs alone on the local
# backend (--iterations 0), is exported as a model directory, and Oat's program runs RL from it with the
# local arm's options (top 6 layers, lr 1e-5, gigpo, 32 episodes in groups of 8, no partial credit), and the
# local arm's held-out evaluation (64 episodes) before the first round, after round 5 and after round 10: the
# actor plays them, the learner scores their reply effect (the first run here had the actor score it with vLLM's
# prompt log-probs, which did not finish in 30 minutes, and ran with --eval-episodes 0).
#
#   bash experiments/gtn_warm_start_oat.sh            # OUT=runs/oat_recipe; ~25 min + ~4 min a round here
#   WARM_ONLY=1 bash experiments/gtn_warm_start_oat.sh  # the warm start and its export only
#   (BASE_MODEL=gemma3-270m: the warm start of another model, for experiments/gtn_learned.sh)
set -euo pipefail
OUT="${OUT:-runs/oat_recipe}"
PY="${PYTHON:-.venv/bin/python}"
OAT_PY="${OAT_PYTHON:-.venv-oat/bin/python}"
COMMON=(--env game:GuessTheNumber-v0-easy --response-prefix '\boxed{'
        --trainable-layers 6 --max-new-tokens 6 --seed 0 --threads 1)
[ -d "$OUT/warm_start/checkpoint" ] || "$PY" -m oat_dppo.main "${COMMON[@]}" --model "${BASE_MODEL:-smollm2}" --engine hf \
  --warm-start demo:noisy_bisect --warm-start-episodes 600 --warm-start-steps 160 --warm-start-batch 8 \
  --warm-start-lr 2e-4 --iterations 0 --eval-every 0 --no-progress --log none --run-dir "$OUT/warm_start"
[ -f "$OUT/model/config.json" ] || "$PY" -m oat_dppo.export "$OUT/warm_start" "$OUT/model"
[ "${WARM_ONLY:-0}" = 1 ] && exit 0  # the warm start alone (experiments/gtn_learned.sh starts from it)
OMP_NUM_THREADS=1 "$OAT_PY" -m oat_dppo.main --backend oat "${COMMON[@]}" --env-option partial_credit=false --model "$OUT/model" --template chatml \
  --trust-region dppo_binary_tv --learning-rate 1e-5 --episodes-per-iteration 32 --group-size 8 \
  --mini-batch-size 32 --micro-batch-size 8 --advantage gigpo --iterations 10 --eval-episodes 64 --eval-every 5 --gpus 2 \
  --dtype float32 --run-dir "$OUT/oat"
