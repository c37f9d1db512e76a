#!/usr/bin/env bash
# One update, two advantage estimators: why did the Sudoku policy lose its format after its best rollouts?
#
# The random-digit Sudoku run at lr 1e-4 (experiments/sudoku_levers.toml) played its best rollouts at
# iteration 6 (reward 0.353, 12.5 turns an episode, well-formed 0.97) and lost the format in the next
# (well-formed 0.54). This script replays that run to the end of iteration 5 (a CPU run repeats from its
# seed), evaluates it (64 held-out boards), then makes iteration 6's update twice from the same checkpoint,
# the same rollouts and the same seeds, once per advantage estimator, and evaluates each result on the same
# 64 boards. The two branches differ only in `advantage` (a copy of the run directory whose config.json
# names the other estimator, resumed).
#
#   usage: experiments/sudoku_advantage_branch.sh [OUT]     (default runs/sudoku_branch; ~35 min on 2 cores)
#          MODES="group group_episode" (default) the branches; both run at once, one thread each
#          SUMMARY_ONLY=1 experiments/sudoku_advantage_branch.sh docs/results/sudoku_advantage_branch
#                                          the table again from the committed records (2026-11-28)
set -eu
OUT=${1:-runs/sudoku_branch}
PY=${PYTHON:-.venv/bin/python}
MODES=${MODES:-group group_episode}
BASE=$OUT/base
mkdir -p "$OUT"
if [ ! -f "$BASE/metrics.jsonl" ] || [ "$(wc -l < "$BASE/metrics.jsonl")" -lt 6 ]; then
  [ -d "$BASE" ] && rm -rf "$BASE"
  "$PY" -m oat_dppo.main --env game:Sudoku-v0-easy --env-option=history=last \
    '--env-option=obs_suffix=
The digits are 1 to 4. Answer with one move for an empty cell, e.g. {random_example}.' \
    --response-prefix '\boxed{' --model smollm2 --trainable-layers 6 --episodes-per-iteration 16 --group-size 4 \
    --max-new-tokens 6 --engine vllm --engine-dtype float32 --vllm-enforce-eager --trust-region dppo_binary_tv \
    --learning-rate 0.0001 --mini-batch-size 16 --micro-batch-size 8 --advantage group --iterations 6 --seed 0 \
    --eval-every 6 --eval-episodes 64 --save-every 3 --keep-checkpoint --log-episodes 16 --threads 1 \
    --run-dir "$BASE" --backend local --no-progress > "$OUT/base.log" 2>&1
fi
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
  pids=()
  for mode in $MODES; do
    b=$OUT/$mode
    rm -rf "$b" && cp -r "$BASE" "$b"
    "$PY" - "$b/config.json" "$mode" <<'PYEOF'
import json, sys
path, mode = sys.argv[1], sys.argv[2]
cfg = json.load(open(path))
cfg["advantage"] = mode
json.dump(cfg, open(path, "w"), indent=2)
PYEOF
    "$PY" -m oat_dppo.main --resume "$b" --iterations 7 --eval-every 7 --threads 1 --no-progress > "$OUT/$mode.log" 2>&1 &
    pids+=($!)
  done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
fi
# The table (SUMMARY_ONLY=1 prints it again): held-out play before and after the update, and how each
# estimator spread its advantages over iteration 6's well-formed moves (the same 16 episodes in both).
"$PY" - "$OUT" $MODES <<'PYEOF'
import json, os, sys
out, modes = sys.argv[1], sys.argv[2:]
def rows(d, name="metrics.jsonl"):
    return [json.loads(l) for l in open(f"{out}/{d}/{name}")]
keys = ["eval/reward_mean", "eval/well_formed_rate", "eval/turns_mean", "eval/outcome_correct"]
cols = ["held-out reward", "well-formed", "turns", "correct placements", "optimizer steps", "kept (A<0)",
        "|pi - mu| over the update", "well-formed moves with A < 0", "sum of A over well-formed moves"]
print("| policy (64 held-out boards) | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
before = rows("base")[5]
print("| after iteration 5 (before 6's update) | " + " | ".join(f"{before[k]:.3f}" for k in keys) + " |" + " |" * 5)
for m in modes:
    if not os.path.exists(f"{out}/{m}/metrics.jsonl") or len(rows(m)) < 7:
        print(f"| --advantage {m}: not run |"); continue
    r = rows(m)[6]
    adv = [t["advantage"] for e in rows(m, "episodes.jsonl") if e["iteration"] == 6 for t in e["turns"] if t["well_formed"]]
    print(f"| after it, --advantage {m} | " + " | ".join(f"{r[k]:.3f}" for k in keys)
          + f" | {r['train/optimizer_steps']:.0f} | {r['train/kept_frac_neg']:.3f} | {r['train/prob_diff_mean']:.4f}"
          + f" | {sum(a < 0 for a in adv)} of {len(adv)} | {sum(adv):+.2f} |")
PYEOF
