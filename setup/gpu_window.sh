#!/usr/bin/env bash
# One GPU window (15 minutes of device time, the kit's transfer included), after the kit is installed
# (../shared/gpu/README.md): the decisive study first (experiments/gpu_decisive.toml: PG-IS against
# DPPO-TV with vLLM bf16 rollouts, 5 seeds, as many at once as the card holds), the peers' pilot
# (experiments/peers_gtn.toml) beside it, both stopped at the deadline. Finished runs land in their
# studies' committed results (docs/results/...); they, every run's metrics so far and logs travel back
# in $OUT/window.tar.gz, beside the GPU's memory over time. Re-running it in the next window continues
# the studies.
#
#   usage: setup/gpu_window.sh [SECONDS] [PARALLEL]     (defaults: 420 s, 6 decisive runs at once)
set -u
DEADLINE=${1:-420}; PARALLEL=${2:-6}
OUT=${OUT:-runs/gpu_window}; mkdir -p "$OUT"
SITE=${SITE:-$HOME/kit/site}
# On the kit the project is on PYTHONPATH: its top-level envs/ must be importable as oat_dppo_envs.
[ -d "$SITE" ] && [ ! -e "$SITE/oat_dppo_envs" ] && ln -s "$PWD/envs" "$SITE/oat_dppo_envs"
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
(while sleep 15; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"; done) \
  > "$OUT/gpu_usage.txt" 2>&1 &
MONITOR=$!
start=$(date +%s)
timeout -s INT -k 60 "$DEADLINE" "${PYTHON:-python3}" -m oat_dppo.study experiments/gpu_decisive.toml --parallel "$PARALLEL" \
  > "$OUT/gpu_decisive.log" 2>&1 &
DECISIVE=$!
sleep 30   # the decisive runs' vLLM engines profile their memory first
timeout -s INT -k 60 $((DEADLINE - 30)) "${PYTHON:-python3}" -m oat_dppo.study experiments/peers_gtn.toml --parallel 3 \
  > "$OUT/peers_gtn.log" 2>&1 &
wait "$DECISIVE" $!
# a run that outlived its study (stopped at the deadline) must not hold the GPU or the copy below
pkill -INT -f "runs/studies/(gpu_decisive|peers_gtn)/" 2>/dev/null; sleep 5; pkill -9 -f "runs/studies/(gpu_decisive|peers_gtn)/" 2>/dev/null
kill "$MONITOR" 2>/dev/null
echo "studies ran $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu.txt"
# $OUT returns at most 8 files: everything else travels in one archive (unpack it in the checkout:
# `tar -xzf window.tar.gz` puts the finished runs under docs/results/, the rest under runs/studies/).
paths=()
for s in gpu_decisive peers_gtn; do
  [ -d "docs/results/$s" ] && paths+=("docs/results/$s")
  [ -d "runs/studies/$s" ] && while IFS= read -r f; do paths+=("$f"); done < <(
    find "runs/studies/$s" \( -name config.json -o -name metrics.jsonl -o -name '*.log' -o -name '*.md' -o -name '*.csv' \) -size -4M)
done
tar -czf "$OUT/window.tar.gz" "${paths[@]}" && tar -tzf "$OUT/window.tar.gz" | grep -c . | sed 's/^/files in window.tar.gz: /'
ls -l "$OUT"
