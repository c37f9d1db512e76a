#!/usr/bin/env bash
# One GPU window (15 minutes of device time, the kit's transfer included; ../shared/gpu/README.md): the
# next unfinished work in a fixed order, each step in the time the deadline leaves, then everything that
# ran packed into one archive, $OUT/window.tar.gz. Land it here with `make land-gpu ARCHIVE=...`
# (setup/land_gpu_window.py). Running it again in the next window continues where this one stopped.
#
#   1. oat      the Oat program on the GPU: setup/oat_gpu_window.sh SECONDS, once that kit exists (skipped until then)
#   2. studies  in this order, sharing PARALLEL runs at once: gpu_decisive (its unfinished runs first),
#               gpu_decisive_control (the float32 control); finished runs are committed to
#               docs/results/<study>/, the rest stop at the deadline
#   3. determinism  one seed, three runs (two --deterministic, one plain): where they part and the mode's
#               cost (python -m benchmarks.reproducibility, ~3 minutes, into docs/results/gpu_determinism/;
#               skipped once its determinism.json says complete). DETERMINISM_FIRST=1 runs it before step 1.
#   4. studies  peers_gtn (the peers' pilot), as in 2
#   5. speed    issue 39's comparison on the GPU: setup/speed_gpu_window.sh SECONDS, once it exists
#   6. bench    `python -m benchmarks gpu`, one section at a time while BENCH_MIN_S seconds remain
#
#   usage: setup/gpu_window.sh [SECONDS] [PARALLEL]     (defaults: 420 s, 6 runs at once)
#          DRY_RUN=1 setup/gpu_window.sh                prints the order and each study's runs left; runs nothing
set -u
DEADLINE=${1:-420}; PARALLEL=${2:-6}
PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu_window_out}     # what comes back from the device (the archive and a summary)
W=${WINDOW_DIR:-runs/gpu_window}    # this window's logs and step outputs (packed into the archive)
HOOKS=${HOOKS:-setup}               # where the steps that need their own kit live
WINDOW=${WINDOW:-$(date -u +%F)}
RESERVE=${RESERVE:-75}              # seconds kept back: a stopped study's runs get 60 s to end, then the packing
STAGGER_S=${STAGGER_S:-30}          # between two studies' starts: the first one's vLLM engines size their caches
BENCH_MIN_S=${BENCH_MIN_S:-240}
DETERMINISM_S=${DETERMINISM_S:-180}        # the determinism step's budget (its three runs side by side)
DETERMINISM_MIN_S=${DETERMINISM_MIN_S:-150}
DETERMINISM_OUT=docs/results/gpu_determinism
STUDIES=(gpu_decisive gpu_decisive_control peers_gtn)
DRY=${DRY_RUN:-0}
start=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - start) - RESERVE )); }
say() { echo "[$(date -u +%T) +$(( $(date +%s) - start ))s] $*" | tee -a "$W/steps.txt"; }
mkdir -p "$OUT" "$W"
: > "$W/steps.txt"
printf 'window=%s\ncommit=%s\ndeadline_s=%s\nparallel=%s\n' "$WINDOW" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$DEADLINE" "$PARALLEL" > "$W/window.txt"

if [ "$DRY" != 1 ]; then
  export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$W/window.txt" 2>&1
  (while sleep 15; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"; done) \
    > "$W/gpu_usage.txt" 2>&1 &
  MONITOR=$!
fi

# A step that exists only once its kit does: run it with the time left, or say in one line why not.
hook() {  # name script
  local name=$1 script=$2 budget; budget=$(left)
  if [ ! -x "$script" ]; then say "$name: skipped ($script does not exist yet)"; return; fi
  if [ "$budget" -lt 60 ]; then say "$name: skipped (${budget} s left)"; return; fi
  if [ "$DRY" = 1 ]; then say "$name: would run $script $budget"; return; fi
  say "$name: $script $budget"
  mkdir -p "$W/$name"
  STEP_OUT="$W/$name" timeout -s INT -k 30 "$budget" "$script" "$budget" > "$W/$name.log" 2>&1
  say "$name: exit $?"
}

runs_left() {  # study -> runs not done (to resume + to start), from the study's own dry run; "?" if it cannot say
  local n
  n=$("$PY" -m oat_dppo.study "experiments/$1.toml" --dry-run 2>/dev/null |
    sed -n 's/.* done (skipped), \([0-9]*\) to resume, \([0-9]*\) to start.*/\1 \2/p' | awk '{print $1 + $2}')
  echo "${n:-?}"
}

# Rounds: the studies with runs left take PARALLEL slots in the order above (the decisive study's runs
# first); a round ends when its studies do (or at the deadline), and the next one shares the slots again.
# A study that made no progress in a round (its runs failed) gets no further round.
studies() {  # study...: these studies, in this order
  declare -A ran=()  # study -> its runs left when it last started; "stuck" once a round left it there
  local round s n k free budget pids
  for round in 1 2 3 4; do
    free=$PARALLEL; pids=()
    for s in "$@"; do
      [ "${ran[$s]:-}" = stuck ] && continue
      n=$(runs_left "$s")
      # a study the dry run cannot count (no project on $PY's path, a bad study file) is not "done"
      [ "$n" = "?" ] && { say "$s: cannot count its runs ($PY -m oat_dppo.study experiments/$s.toml --dry-run failed): skipped"; ran[$s]=stuck; continue; }
      if [ -n "${ran[$s]:-}" ] && [ "$n" -gt 0 ] && [ "$n" -ge "${ran[$s]}" ]; then
        say "$s: no run finished in the last round ($n left): left alone"; ran[$s]=stuck; continue
      fi
      [ "$n" -eq 0 ] && { [ "$round" = 1 ] && say "$s: every run done"; continue; }
      [ "$free" -eq 0 ] && { say "$s: $n runs left, waiting for a free slot"; continue; }
      budget=$(left)
      [ "$budget" -lt 120 ] && { say "$s: $n runs left, ${budget} s is too little to start"; continue; }
      k=$(( n < free ? n : free )); free=$(( free - k )); ran[$s]=$n
      if [ "$DRY" = 1 ]; then
        say "studies, round $round: $s: $n runs left, would run $k at a time for ${budget} s"
        continue
      fi
      [ "${#pids[@]}" -gt 0 ] && sleep "$STAGGER_S" && budget=$(left)
      say "studies, round $round: $s: $n runs left, $k at a time, ${budget} s"
      timeout -s INT -k 60 "$budget" "$PY" -m oat_dppo.study "experiments/$s.toml" --parallel "$k" >> "$W/$s.log" 2>&1 &
      pids+=($!)
    done
    [ "$DRY" = 1 ] && return
    [ "${#pids[@]}" -eq 0 ] && return
    wait "${pids[@]}"
    # a run that outlived its study (stopped at the deadline) must not hold the GPU or the copy below
    for s in "${STUDIES[@]}"; do pkill -INT -f "runs/studies/$s/" 2>/dev/null; done; sleep 5
    for s in "${STUDIES[@]}"; do pkill -9 -f "runs/studies/$s/" 2>/dev/null; done
  done
}

# One seed, one run (issue 37, part 3): alone on the card, after the studies above have ended.
determinism() {
  local budget; budget=$(left)
  [ -n "${DETERMINISM_TRIED:-}" ] && return  # once a window (DETERMINISM_FIRST=1 calls it twice)
  DETERMINISM_TRIED=1
  if grep -qs '"complete": true' "$DETERMINISM_OUT/determinism.json"; then
    say "determinism: done ($DETERMINISM_OUT/determinism.json)"; return
  fi
  if [ "$budget" -lt "$DETERMINISM_MIN_S" ]; then say "determinism: skipped (${budget} s left)"; return; fi
  [ "$budget" -gt "$DETERMINISM_S" ] && budget=$DETERMINISM_S
  if [ "$DRY" = 1 ]; then say "determinism: would run 3 runs of one seed for up to ${budget} s"; return; fi
  say "determinism: python -m benchmarks.reproducibility --budget-s $budget"
  timeout -s INT -k 60 $(( budget + 60 )) "$PY" -m benchmarks.reproducibility --budget-s "$budget" \
    --out "$DETERMINISM_OUT" --runs-dir runs/determinism > "$W/determinism.log" 2>&1
  say "determinism: exit $?"
  mkdir -p "$W/determinism" && cp runs/determinism/*.log "$W/determinism/" 2>/dev/null  # the runs' own logs
}

bench() {
  local section budget
  for section in rollout learner mismatch; do
    budget=$(left)
    if [ "$budget" -lt "$BENCH_MIN_S" ]; then say "bench gpu --sections $section: skipped (${budget} s left)"; continue; fi
    if [ "$DRY" = 1 ]; then say "bench gpu --sections $section: would run for up to ${budget} s"; continue; fi
    say "bench gpu --sections $section"
    timeout -s INT -k 30 "$budget" "$PY" -m benchmarks gpu --sections "$section" --out "$W/bench_gpu_$section.md" \
      > "$W/bench_gpu_$section.log" 2>&1
    say "bench gpu --sections $section: exit $?"
  done
}

say "window $WINDOW: ${DEADLINE} s, ${PARALLEL} runs at once$([ "$DRY" = 1 ] && echo ' (dry run: nothing runs)')"
[ "${DETERMINISM_FIRST:-0}" = 1 ] && determinism
hook oat "$HOOKS/oat_gpu_window.sh"
studies gpu_decisive gpu_decisive_control
determinism
studies peers_gtn
hook speed "$HOOKS/speed_gpu_window.sh"
bench
[ "$DRY" = 1 ] && exit 0
kill "$MONITOR" 2>/dev/null
for s in "${STUDIES[@]}"; do  # the window's own report of each study it ran (no figures needed to land)
  [ -d "runs/studies/$s" ] && "$PY" -m oat_dppo.study "experiments/$s.toml" --report > /dev/null 2>&1
done
say "done after $(( $(date +%s) - start )) s"
# $OUT returns at most 8 files: everything travels in one archive (setup/land_gpu_window.py unpacks it).
paths=("$W")
[ -d "$DETERMINISM_OUT" ] && paths+=("$DETERMINISM_OUT")
for s in "${STUDIES[@]}"; do
  [ -d "docs/results/$s" ] && paths+=("docs/results/$s")
  [ -d "runs/studies/$s" ] && while IFS= read -r f; do paths+=("$f"); done < <(
    find "runs/studies/$s" \( -name config.json -o -name metrics.jsonl -o -name '*.log' -o -name '*.md' -o -name '*.csv' \) -size -4M)
done
tar -czf "$OUT/window.tar.gz" "${paths[@]}" && tar -tzf "$OUT/window.tar.gz" | grep -c . | sed 's/^/files in window.tar.gz: /'
cp "$W/steps.txt" "$W/window.txt" "$OUT/" 2>/dev/null
ls -l "$OUT"
