#!/usr/bin/env bash
# Issue 50: does RL from the warm start lose reading because each update sees few hidden numbers?
# experiments/gtn_epochs.sh's arm B (group_norm, lr 1e-4, optimizer steps of 16 turns, 64 episodes an iteration in
# 8 groups of 8) fell from 0.391 to 0.188 held out while repeated guesses rose 0.19 -> 0.31. Every winning episode
# of a group ends on the group's hidden number, so with 8 groups an update raises at most 8 numbers wherever they
# were played. These arms keep everything else of that arm and spread the same 64 episodes over more hidden numbers:
#
#   ARM=groups32 bash experiments/gtn_hidden_numbers.sh   # 32 groups of 2, group_norm
#   ARM=groups64 bash experiments/gtn_hidden_numbers.sh   # 64 groups of 1: no group baseline, batch_norm
#   ARM=groups8 bash experiments/gtn_hidden_numbers.sh    # gtn_epochs.sh's arm B again, with today's code
#
# And the control every arm is read against: groups8 with its advantages shuffled over the batch's turns
# (--shuffle-advantages), updates of the same size that carry no credit. If an arm loses reading as fast as the
# control, the loss is the updates' noise, not what the advantages say.
#
#   ARM=groups8_shuffled bash experiments/gtn_hidden_numbers.sh
#
# `python -m benchmarks gradient-noise` puts this loss's noise scale at ~1,000 turns a step (docs/warm_start.md): the
# steps above (16 turns) are ~98% noise. The arms it prescribes, one optimizer step an iteration over 320 episodes
# (40 groups of 8, ~1,050 turns), 12 iterations, each ~2.7 h here with the two on 2 cores (evaluations included):
#
#   ARM=steps1000 bash experiments/gtn_hidden_numbers.sh
#   ARM=steps1000_shuffled bash experiments/gtn_hidden_numbers.sh
#
# steps1000 beat its control (rollout success 0.325 -> 0.506 in 8 steps, docs/warm_start.md); a step of ~1,000 turns
# is mostly signal, so it may take a longer one: the same arm and control at lr 3e-4.
#
#   ARM=steps1000_lr3 bash experiments/gtn_hidden_numbers.sh
#   ARM=steps1000_lr3_shuffled bash experiments/gtn_hidden_numbers.sh
#
# And steps1000's policy after its 8 steps at lr 1e-4 (its checkpoint at iteration 7, exported) taken on at lr 3e-4:
#
#   python -m oat_dppo.export runs/gtn_hidden_numbers/steps1000 runs/gtn_hidden_numbers/steps1000_model
#   ARM=steps1000_then_lr3 bash experiments/gtn_hidden_numbers.sh
#
# A second held-out set (--seed 1, 128 episodes; the seed-0 set's hidden numbers are uneven): a model's evaluation
# before (iteration -1) and after one update of 8 episodes, e.g. the continuation's checkpoint and the warm start:
#
#   python -m oat_dppo.export runs/gtn_hidden_numbers/steps1000_then_lr3 runs/gtn_hidden_numbers/then_lr3_model
#   ARM=heldout_seed1 MODEL=runs/gtn_hidden_numbers/then_lr3_model OUT=runs/heldout/then_lr3 bash experiments/gtn_hidden_numbers.sh
#   ARM=heldout_seed1 OUT=runs/heldout/warm_start bash experiments/gtn_hidden_numbers.sh
#
# From the continuation's policy after its iteration 7 (exported as above), where rollouts held ~0.6: more optimizer
# steps an iteration under the trust region (4 steps of 80 whole episodes, ~260 turns each, at lr 1e-4) against the
# same one step of ~1,000 turns at lr 3e-4, the same rollout seeds, 256 held-out episodes every 4 iterations:
#
#   ARM=then_lr3_steps4 bash experiments/gtn_hidden_numbers.sh
#   ARM=then_lr3_step1 bash experiments/gtn_hidden_numbers.sh
#
# A longer warm start before the same RL: the warm start's imitation of demo:noisy_bisect (0.83 as played) ended
# ~0.7 nats a turn above that player's own entropy (1.49 nats a turn; ~0.73 a token measured, ~0.50 its floor),
# so the model plays well below it. 240 more supervised steps of 16 turns at lr 1e-4 from the same model, its
# evaluation on the 256 held-out episodes (the warm start alone), then then_lr3_steps4's RL (4 steps of 80 episodes
# at lr 1e-4):
#
#   ARM=longer_warm_start bash experiments/gtn_hidden_numbers.sh
#
# Step-level credit from there: longer_warm_start's policy after its RL iteration 3 (exported), the same RL with
# --advantage gigpo (a guess that repeats one, or strays from the middle, is compared with the other guesses made
# from the same hint history, not credited with its episode's win):
#
#   python -m oat_dppo.export runs/gtn_hidden_numbers/longer_warm_start runs/gtn_hidden_numbers/longer_warm_start_model
#   ARM=lws_gigpo bash experiments/gtn_hidden_numbers.sh
#
# And its control: the same start and RL (group_norm), the advantages shuffled over each batch's turns: what the
# updates do to held-out success without credit (a policy imitating noisy_bisect may gain from any update that
# sharpens it):
#
#   ARM=lws_shuffled bash experiments/gtn_hidden_numbers.sh
#
# By its iteration 7 longer_warm_start plays almost deterministically (entropy 0.13 a token) and fails the same
# hidden numbers in every episode: a group whose 8 episodes all fail has one return, so group_norm and gigpo give its
# turns no advantage at all, and what fails is never pushed down. A batch baseline (each turn against the whole
# batch) gives those turns their negative advantage. Its policy after iteration 7 (exported), the same RL with
# --advantage batch_norm:
#
#   python -m oat_dppo.export runs/gtn_hidden_numbers/longer_warm_start runs/gtn_hidden_numbers/lws7_model
#   ARM=lws7_batch_norm bash experiments/gtn_hidden_numbers.sh
#
# Same model as gtn_epochs.sh (runs/oat_recipe/model, bash experiments/gtn_warm_start_oat.sh's first two steps),
# ~70 min an arm on one core here. Records: docs/results/gtn_hidden_numbers/.
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-runs/gtn_hidden_numbers}"
ARM="${ARM:-groups64}"
case "$ARM" in steps1000_then_lr3) MODEL="${MODEL:-$OUT/steps1000_model}" ;; lws7_*) MODEL="${MODEL:-$OUT/lws7_model}" ;; lws_*) MODEL="${MODEL:-$OUT/longer_warm_start_model}" ;; then_lr3_*) MODEL="${MODEL:-$OUT/then_lr3_model}" ;; *) MODEL="${MODEL:-runs/oat_recipe/model}" ;; esac
[ -f "$MODEL/config.json" ] || { echo "needs the exported model $MODEL: bash experiments/gtn_warm_start_oat.sh (its first two steps), or for steps1000_then_lr3 / then_lr3_* / lws* the exports above"; exit 2; }
case "$ARM" in
  groups32) OPTS=(--group-size 2 --advantage group_norm) ;;
  groups64) OPTS=(--group-size 1 --advantage batch_norm) ;;
  groups8) OPTS=(--group-size 8 --advantage group_norm) ;;
  groups8_shuffled) OPTS=(--group-size 8 --advantage group_norm --shuffle-advantages) ;;
  steps1000) OPTS=(--group-size 8 --advantage group_norm) ;;
  steps1000_shuffled) OPTS=(--group-size 8 --advantage group_norm --shuffle-advantages) ;;
  steps1000_lr3) OPTS=(--group-size 8 --advantage group_norm) ;;
  steps1000_lr3_shuffled) OPTS=(--group-size 8 --advantage group_norm --shuffle-advantages) ;;
  steps1000_then_lr3) OPTS=(--group-size 8 --advantage group_norm) ;;
  heldout_seed1) OPTS=(--group-size 8 --advantage group_norm) ;;
  then_lr3_steps4|then_lr3_step1) OPTS=(--group-size 8 --advantage group_norm) ;;
  lws_gigpo) OPTS=(--group-size 8 --advantage gigpo) ;;
  lws_shuffled) OPTS=(--group-size 8 --advantage group_norm --shuffle-advantages) ;;
  lws7_batch_norm) OPTS=(--group-size 8 --advantage batch_norm) ;;
  longer_warm_start) OPTS=(--group-size 8 --advantage group_norm --warm-start demo:noisy_bisect --warm-start-episodes 1200
                           --warm-start-steps 240 --warm-start-batch 16 --warm-start-lr 1e-4 --keep-best) ;;
  *) echo "ARM: groups32, groups64, groups8, groups8_shuffled, steps1000[_lr3], steps1000[_lr3]_shuffled, steps1000_then_lr3, heldout_seed1, then_lr3_steps4 / then_lr3_step1, longer_warm_start, lws_gigpo, lws_shuffled or lws7_batch_norm"; exit 2 ;;
esac
LR=1e-4
case "$ARM" in steps1000_lr3*|steps1000_then_lr3|then_lr3_step1) LR=3e-4 ;; esac
# the arms' shape: 64 episodes, steps of 16 turns, 20 iterations; steps1000*: 320 episodes, one step, 12 iterations
SHAPE=(--episodes-per-iteration 64 --mini-batch-size 16 --iterations 20 --eval-every 5)
case "$ARM" in steps1000*) SHAPE=(--episodes-per-iteration 320 --mini-batch-size 4096 --iterations 12 --eval-every 4) ;; esac
SEED=0 EVAL_EPISODES=64 LOGGED=8 SAVE=4
case "$ARM" in
  then_lr3_steps4|lws*) SHAPE=(--episodes-per-iteration 320 --mini-batch-unit episodes --mini-batch-size 80 --iterations 12 --eval-every 4); EVAL_EPISODES=256 ;;
  # longer_warm_start ran 12 iterations and was resumed to 16 (--resume ... --iterations 16): the same run as 16 at once;
  # it ran before --keep-best, which keeps the policy of its best evaluation (0.949 after iteration 11) from now on
  longer_warm_start) SHAPE=(--episodes-per-iteration 320 --mini-batch-unit episodes --mini-batch-size 80 --iterations 16 --eval-every 4); EVAL_EPISODES=256 ;;
  then_lr3_step1) SHAPE=(--episodes-per-iteration 320 --mini-batch-size 4096 --iterations 12 --eval-every 4); EVAL_EPISODES=256 ;;
esac
case "$ARM" in heldout_seed1) SHAPE=(--episodes-per-iteration 8 --iterations 1 --eval-every 1); SEED=1 EVAL_EPISODES=128 LOGGED=0 SAVE=0 ;; esac
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main --env game:GuessTheNumber-v0-easy --env-option partial_credit=false \
  --response-prefix '\boxed{' --max-new-tokens 6 --trainable-layers 6 --model "$MODEL" --template "${TEMPLATE:-chatml}" \
  --trust-region dppo_binary_tv "${SHAPE[@]}" "${OPTS[@]}" --num-ppo-epochs 1 \
  --learning-rate "$LR" --micro-batch-size 8 \
  --eval-episodes "$EVAL_EPISODES" --seed "$SEED" --threads 1 --log-episodes "$LOGGED" --no-progress \
  --engine vllm --engine-dtype float32 --save-every "$SAVE" --run-dir "$OUT/$ARM" "$@"
