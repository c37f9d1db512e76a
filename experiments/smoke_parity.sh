#!/usr/bin/env bash
# Issue 67 part 3: the smoke:digits parity gap (an Oat run evaluated at 1.68 where the local one gave 1.05, one
# seed each) measured over seeds: tests/test_oat_learning.py's problem (two-turn smoke:digits, tiny-qwen3 in
# float32, 16 episodes a round in groups of 4, steps of 16 turns at lr 1e-3, 20 rounds), Oat 1 actor + 1 learner
# (ZeRO-2) and the local backend (HF engine), seeds 0-2 a side, each ending with 64 validation episodes.
#
#   bash experiments/smoke_parity.sh          # ~2 min a run on one core; writes docs/results/smoke_parity.csv
#
# Needs .venv-oat (make setup-oat). A finished run is skipped on a second call.
set -euo pipefail
PY="${PYTHON:-.venv/bin/python}" OAT_PY="${OAT_PYTHON:-.venv-oat/bin/python}"
OUT="${OUT:-runs/smoke_parity}" CSV="${CSV:-docs/results/smoke_parity.csv}"
PROBLEM=(--env smoke:digits --model tiny-qwen3 --dtype float32 --group-size 4 --max-new-tokens 8 --iterations 20
         --episodes-per-iteration 16 --aggregation token_mean --learning-rate 1e-3 --eval-every 20 --eval-episodes 64)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
for seed in ${SEEDS:-0 1 2}; do
  [ -f "$OUT/local_s$seed/metrics.jsonl" ] || "$PY" -m oat_dppo.main "${PROBLEM[@]}" --seed "$seed" --backend local \
    --engine hf --mini-batch-size 16 --micro-batch-size 4 --threads 1 --no-progress --log none --test-episodes 0 \
    --run-dir "$OUT/local_s$seed" > "$OUT.local_s$seed.log" 2>&1
  [ -f "$OUT/oat_s$seed/metrics.jsonl" ] || "$OAT_PY" -m oat_dppo.main "${PROBLEM[@]}" --seed "$seed" --backend oat \
    --no-flash-attn --shm-size-mb 200 --train-batch-size 16 --check-sync off --gpus 2 --zero-stage 2 \
    --train-batch-size-per-device 4 --run-dir "$OUT/oat_s$seed" > "$OUT.oat_s$seed.log" 2>&1
done
"$PY" - "$OUT" "$CSV" <<'PY'
import csv, json, sys
from pathlib import Path
out, path = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for run in sorted(out.glob("*_s*")):
    backend, seed = run.name.rsplit("_s", 1)
    files = sorted(run.glob("metrics.jsonl")) + sorted(run.glob("*/metrics.jsonl"))
    metrics = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    evals = [m["eval/reward_mean"] for m in metrics if "eval/reward_mean" in m and m.get("iteration", 0) >= 0]
    rollouts = [m["rollout/reward_mean"] for m in metrics if "rollout/reward_mean" in m]
    rows.append({"backend": backend, "seed": seed, "final_eval": f"{evals[-1]:.4f}" if evals else "",
                 "last5_rollout": f"{sum(rollouts[-5:]) / 5:.4f}", "rounds": len(rollouts)})
with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(path.read_text())
PY
