#!/usr/bin/env bash
# Issue 51, part 3: what a 64-board Sudoku-easy evaluation costs beside its own generation (target: at most 2x).
# SmolLM2 (the instruct model) with the Sudoku levers' prompt (the newest observation and an example move, which
# the base model copies, so episodes last a few turns and have replies to score), vLLM; one tiny iteration so that two evaluations
# run (iteration -1 before the update, 0 after it); prints each evaluation's seconds, its generation's and the ratio.
#
#   bash experiments/sudoku_eval_cost.sh          # ~10-15 min on one core
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-runs/sudoku_eval_cost}"
rm -rf "$OUT"
OMP_NUM_THREADS=1 "$PY" -m oat_dppo.main --env game:Sudoku-v0-easy --model smollm2 --template chatml \
  --env-option history=last --env-option 'obs_suffix=
The digits are 1 to 4. Answer with one move for an empty cell, e.g. {example}.' \
  --response-prefix '\boxed{' --max-new-tokens 6 --trainable-layers 6 --trust-region dppo_binary_tv \
  --episodes-per-iteration 4 --group-size 4 --mini-batch-size 4 --micro-batch-size 4 --iterations 1 \
  --eval-every 1 --eval-episodes 64 --seed 0 --threads 1 --no-progress --engine vllm --engine-dtype float32 \
  --run-dir "$OUT" "$@" > "$OUT.log" 2>&1
"$PY" - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "time/eval_s" in r:
        total, gen = r["time/eval_s"], r["time/eval_generate_s"]
        print(f"iteration {r['iteration']}: evaluation {total:.1f} s, its generation {gen:.1f} s, ratio {total / gen:.2f}x; "
              f"{r.get('eval/reply_effect_turns', 0):.0f} scored turns, {r['eval/turns_mean']:.2f} turns an episode")
PY
