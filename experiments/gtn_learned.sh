#!/usr/bin/env bash
# Issue 50 part 3: GuessTheNumber-easy learned by SmolLM2-135M-Instruct, warm start then DPPO, from the instruct model.
#
#   bash experiments/gtn_learned.sh     # ~3.5 h on 2 cores beside another run; stop with Ctrl-C, run again to resume
#   BASE=gemma3-270m ITERATIONS=8 bash experiments/gtn_learned.sh   # the same chain from Gemma-3-270M base (make setup-gemma
#                                                   # first): held out 0.723 -> 0.973 -> 0.988 at iterations 3 / 7
#
# 1. The warm start: 160 supervised steps of 8 turns (lr 2e-4, top 6 layers) imitating demo:noisy_bisect, a player
#    that reads every hint and bisects one time in four (wins 0.83 as played; the optimal bisector wins every game),
#    exported to runs/oat_recipe/model (experiments/gtn_warm_start_oat.sh's first two steps, ~25 min).
# 2. ARM=longer_warm_start of experiments/gtn_hidden_numbers.sh: 240 more supervised steps of 16 turns at lr 1e-4,
#    the held-out evaluation before any RL (256 episodes: the warm start alone), then 16 iterations of DPPO
#    binary-TV (group_norm, 320 episodes in groups of 8 an iteration, 4 optimizer steps of 80 whole episodes,
#    lr 1e-4, no partial credit), held out every 4 iterations.
#
# --keep-best keeps the policy of the best held-out evaluation in $RUN/best/ (python -m oat_dppo.export $RUN OUT --best).
# Measured (docs/warm_start.md): held out 0.676 before RL, 0.707 / 0.809 / 0.949 / 0.875 after iterations 3 / 7 / 11
# / 15; the reply effect 0.54 -> 0.93. Record: docs/results/gtn_hidden_numbers/longer_warm_start/.
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
BASE="${BASE:-smollm2}"
case "$BASE" in  # where each model's chain lives, and its template (a base model's is raw)
  smollm2) WARM=runs/oat_recipe OUT=runs/gtn_hidden_numbers TEMPLATE=chatml ;;
  gemma3-270m) WARM=runs/gemma_recipe OUT=runs/gtn_learned_gemma TEMPLATE=raw ;;
  *) echo "BASE: smollm2 or gemma3-270m" >&2; exit 2 ;;
esac
RUN="$OUT/longer_warm_start"
WARM_ONLY=1 OUT="$WARM" BASE_MODEL="$BASE" bash experiments/gtn_warm_start_oat.sh
if [ -d "$RUN/checkpoint" ]; then  # a stopped run goes on from its last checkpoint
  OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main --resume "$RUN" --iterations "${ITERATIONS:-16}" --threads 1 --no-progress --keep-best
else
  ARM=longer_warm_start MODEL="$WARM/model" OUT="$OUT" TEMPLATE="$TEMPLATE" bash experiments/gtn_hidden_numbers.sh \
    --iterations "${ITERATIONS:-16}"
fi
