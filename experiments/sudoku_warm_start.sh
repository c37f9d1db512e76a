#!/usr/bin/env bash
# Issue 50, part 4: Sudoku-easy from a warm start, beside the Sudoku levers' RL-only runs (docs/results/sudoku_levers.md).
#
# The levers' best prompt (the newest reply and the board, `history=last`, digits 1-4 stated, an example move drawn
# from the board), SmolLM2-135M-Instruct, top 6 layers. First the warm start: `demo:board_rules` (an empty cell and a
# digit its row, column and box allow, the most constrained cell first; it reads only the board the prompt shows),
# 512 of its episodes, 200 supervised steps of 8 turns at lr 2e-4 (the by-hand try: 100 steps at 1e-4 left
# ~0.65 nats a token and held-out 0.23). Its held-out evaluation (iteration -1, 64 boards) is the warm start alone;
# then RL continues in the same run: DPPO binary-TV, `--advantage gigpo` (step-level credit: the turns of a group
# that see the same board are compared), 16 episodes an iteration in groups of 4, lr 1e-4, held out every 5.
#
#   bash experiments/sudoku_warm_start.sh                  # ~30 min of warm start, an 18-min evaluation, ~5 min an iteration
#   bash experiments/sudoku_warm_start.sh --iterations 30  # continue (the run resumes from its last checkpoint)
#   ARM=all_layers bash experiments/sudoku_warm_start.sh   # the same with every layer trained (--trainable-layers 0):
#                                                          # the top 6 layers' NLL was flat from step 40
#   ARM=long_imitation bash experiments/sudoku_warm_start.sh   # the view with far more imitation (2,000 episodes, 1,200
#                                                          # steps of 16 at 1e-4, ~7 h: 21 s a step; resumes)
#   ARM=worked bash experiments/sudoku_warm_start.sh       # demo:board_rules_worked writes the cell's view line and the
#                                                          # digits it lacks before its move: held out 0.593, 5 of 64
#                                                          # solved, before RL; 0.768, 28 of 64, after 3 RL iterations
#                                                          # (31 min of warm start, ~6 min an iteration, 14-20 min an evaluation)
#   ARM=board_view bash experiments/sudoku_warm_start.sh   # the prompt also lays the board out by cell ({board_view}:
#                                                          # each empty cell's "row column" and the digits its row,
#                                                          # column and box hold): both NLLs sat at a uniform pick;
#                                                          # with --warm-start-steps 120: held out 0.322, none solved
#
# Records: docs/results/sudoku_warm_start/.
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
ARM="${ARM:-top6}"
VIEW=""
WARM=()
DEMO=board_rules
PREFIX=(--response-prefix '\boxed{')
NEW_TOKENS=6
ASK="Answer with one move for an empty cell, e.g. {random_example}."
case "$ARM" in
  top6) RUN="${OUT:-runs/sudoku_warm_start}/board_rules_gigpo"; LAYERS=6 ;;
  all_layers) RUN="${OUT:-runs/sudoku_warm_start}/board_rules_all_layers"; LAYERS=0 ;;
  board_view) RUN="${OUT:-runs/sudoku_warm_start}/board_rules_board_view"; LAYERS=6; VIEW='
{board_view}' ;;
  # far more imitation, the lever left: 2,000 demonstrated episodes (~19k turns), 1,200 steps of 16 at 1e-4 (~7 h of one
  # core; a checkpoint every 20 steps, so a stopped run resumes)
  long_imitation) RUN="${OUT:-runs/sudoku_warm_start}/board_rules_long_imitation"; LAYERS=6; VIEW='
{board_view}'; WARM=(--warm-start-episodes 2000 --warm-start-steps 1200 --warm-start-batch 16 --warm-start-lr 1e-4) ;;
  # the rules player's work written before its move (demo:board_rules_worked): the cell's line of the view, the
  # digits it lacks, then \boxed{r c d}; no pre-filled \boxed{, room for the work (~37 tokens). RL then credits each
  # move by its own reward (Sudoku grades every move): batch_norm with gamma 0, lr 3e-5; ARM=worked_gigpo keeps the
  # gigpo RL above (lr 1e-4), which lost the warm start's copy in one iteration
  worked|worked_gigpo) RUN="${OUT:-runs/sudoku_warm_start}/board_rules_$ARM"; LAYERS=6; VIEW='
{board_view}'; DEMO=board_rules_worked; PREFIX=(); NEW_TOKENS=48
    ASK="Pick an empty cell, copy its line, name the digits it lacks, then answer with one move, e.g. {random_example}."
    WARM=(--warm-start-steps 240)
    if [ "$ARM" = worked ]; then
      WARM+=(--advantage batch_norm --gamma 0 --learning-rate 3e-5 --eval-every 3 --keep-best)
    fi ;;
  *) echo "ARM: top6, all_layers, board_view, long_imitation, worked or worked_gigpo" >&2; exit 2 ;;
esac
if [ -f "$RUN/checkpoint/state.json" ]; then
  OMP_NUM_THREADS=1 exec "$PY" -m oat_dppo.main --resume "$RUN" --threads 1 --no-progress "$@"
fi
OMP_NUM_THREADS=1 exec "$PY" -m oat_dppo.main --env game:Sudoku-v0-easy --env-option=history=last \
  "--env-option=obs_suffix=$VIEW
The digits are 1 to 4. $ASK" \
  ${PREFIX[@]+"${PREFIX[@]}"} --model smollm2 --template chatml --trainable-layers "$LAYERS" \
  --max-new-tokens "$NEW_TOKENS" --warm-start "demo:$DEMO" --warm-start-episodes 512 --warm-start-steps 200 --warm-start-batch 8 \
  --warm-start-lr 2e-4 \
  --trust-region dppo_binary_tv --advantage gigpo --episodes-per-iteration 16 --group-size 4 \
  --learning-rate 1e-4 --mini-batch-size 16 --micro-batch-size 8 --iterations 15 \
  --engine vllm --engine-dtype float32 --vllm-enforce-eager \
  --eval-every 5 --eval-episodes 64 --save-every 1 --log-episodes 4 --seed 0 --threads 1 --no-progress \
  --run-dir "$RUN" ${WARM[@]+"${WARM[@]}"} "$@"
