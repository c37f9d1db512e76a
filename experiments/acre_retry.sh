#!/usr/bin/env bash
# Issue 68 part 5: ACRE as a multi-turn agent task. `--env-option attempts=2`: a wrong label gets the grader's reply
# ("Your answer `on` is not correct. 1 attempt left.") and one more answer (oat_dppo/envs/retry.py). From the
# mission table's ACRE warm start of one seed, the ACRE cell's RL recipe and its control (the same RL, advantages
# shuffled within each batch), two jobs at once; every run scored once on the test split at its end: reward and
# reply effect (0 for a policy that ignores the reply, whatever it scores).
#
#   python -m oat_dppo.study.mission experiments/mission_table.toml --cells acre_smollm2 --arms warm_start  # first
#   bash experiments/acre_retry.sh          # ~20 min on 2 cores; SEED=1 for the other warm start
#
# Records (config.json, metrics.jsonl, evaluations.jsonl) under docs/results/acre_retry/<arm>_s<seed>/; a finished
# arm is skipped on a second call. Bounds on this env (256 test questions, scripted): python -m oat_dppo.evaluate
# --policy demo:acre_prior / demo:acre_worked ... -- --env rg:acre --env-option attempts=2 (below).
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}" SEED="${SEED:-0}"
WARM="${WARM:-runs/mission_table/acre_smollm2/s$SEED/warm1/model}"
OUT="${OUT:-runs/acre_retry}" REC="${REC:-docs/results/acre_retry}"
[ -d "$WARM" ] || { echo "no warm start at $WARM: run the mission table's ACRE warm start first (see above)" >&2; exit 2; }
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
ENV=(--env rg:acre --env-option attempts=2 --template chatml --max-new-tokens 96)
RECIPE=(--trainable-layers 6 --engine vllm --engine-dtype float32 --trust-region dppo_binary_tv --advantage group_norm
        --group-size 8 --episodes-per-iteration 64 --mini-batch-size 32 --micro-batch-size 8 --learning-rate 3e-5
        --iterations 6 --eval-every 2 --eval-episodes 64 --test-episodes 256 --keep-best --save-every 1 --log none
        --threads 1 --no-progress)
mkdir -p "$OUT" "$REC"
for arm in rl control; do
  [ -f "$REC/${arm}_s$SEED/evaluations.jsonl" ] && continue
  shuffle=$([ "$arm" = control ] && echo --shuffle-advantages || echo --no-shuffle-advantages)
  ( "$PY" -m oat_dppo.main "${ENV[@]}" "${RECIPE[@]}" --model "$WARM" --seed "$SEED" "$shuffle" \
      --run-dir "$OUT/${arm}_s$SEED" > "$OUT/${arm}_s$SEED.log" 2>&1 \
    && mkdir -p "$REC/${arm}_s$SEED" \
    && cp "$OUT/${arm}_s$SEED"/{config.json,metrics.jsonl,evaluations.jsonl} "$REC/${arm}_s$SEED/" ) &
done
wait
for policy in acre_prior acre_worked; do  # the bounds: a constant label, the rules that read the trials
  [ -f "$REC/$policy/evaluations.jsonl" ] || "$PY" -m oat_dppo.evaluate --policy "demo:$policy" --out "$REC/$policy" \
    --split test -- "${ENV[@]}" --seed "$SEED" > /dev/null
done
"$PY" - "$REC" <<'PY'
import json, sys
from pathlib import Path
for run in sorted(Path(sys.argv[1]).iterdir()):
    rows = [json.loads(line) for line in (run / "evaluations.jsonl").read_text().splitlines()]
    for r in rows:
        if r["split"] == "test":
            print(f"{run.name:16s} policy {r.get('policy', '-'):5s} test reward {r['reward_mean']:.3f} (n {r['episodes']:.0f})"
                  f"  turns {r['turns_mean']:.2f}  reply effect {r.get('reply_effect', float('nan')):.3f}"
                  f" over {r.get('reply_effect_turns', 0):.0f} turns")
PY
