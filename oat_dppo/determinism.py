"""`--deterministic` (local backend): pin what can be pinned so that one seed gives one run.

What the mode does, in the order it must happen (`LocalTrainer.__init__` calls these first):

1. `set_cuda_environment()`, before CUDA's first use: `CUBLAS_WORKSPACE_CONFIG=:4096:8` (cuBLAS reads
   it when it makes its first handle; torch's deterministic mode refuses cuBLAS without it).
2. `engine_environment(capability, engine)`, before `import vllm`: `VLLM_BATCH_INVARIANT=1` for the
   colocated engine on a GPU of compute capability 9.0 or more (vLLM's batch-invariant kernels, a beta
   feature: the result of a request no longer depends on the batch it runs in). vLLM reads it at import
   and when its worker starts; 0.25's worker then swaps in its own softmax, log-softmax, mean and bmm
   for every CUDA tensor of the process, the learner's included (one process), and sets
   `CUBLAS_WORKSPACE_CONFIG=:16:8` on Hopper, which torch's deterministic mode accepts too.
3. `enable(seed)`: `torch.use_deterministic_algorithms(True)`, cuDNN deterministic with benchmark
   off, and Python's, NumPy's and torch's (every device's) global generators seeded. The run's own
   randomness was already seeded per use (`oat_dppo.seeds`: episode starts, each rollout's
   per-request sampling seeds, the shuffle of each update); this covers what draws from the globals.

What it cannot pin is said in one line at start (`note`). A kernel with no deterministic
implementation makes torch raise mid-run; `one_line_errors` turns that into one `ConfigError` line
(exit status 2) instead of a traceback. Whether the mode pins a GPU run, and its cost, are measured by
`python -m benchmarks.reproducibility` (docs/results/before_splits.md, "One seed, one run on a GPU").

Importing this module is cheap (no torch): the CLI and tests read it without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
from dataclasses import dataclass, field

from oat_dppo.config import ConfigError

CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
#: The values torch's deterministic mode accepts (vLLM's batch-invariant mode sets the second on Hopper).
CUBLAS_ACCEPTED = (":4096:8", ":16:8")
BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
#: vLLM's batch-invariant kernels: NVIDIA GPUs of compute capability 9.0 and later (H100, H200, B200) in
#: vLLM's documentation of the releases around 0.25; later ones add 8.0 through Triton overrides of
#: every matmul of the process, which would replace the learner's matmuls too, so 8.x is left out here.
MIN_BATCH_INVARIANT_CAPABILITY = (9, 0)


@dataclass
class Pinned:
    """What the mode set on this machine (`pinned`) and what it could not (`not_pinned`)."""

    pinned: list[str] = field(default_factory=list)
    not_pinned: list[str] = field(default_factory=list)

    def note(self) -> str:
        """The one line a run prints at start."""
        line = "deterministic: " + ", ".join(self.pinned)
        if self.not_pinned:
            line += "; not pinned: " + "; ".join(self.not_pinned)
        return line


def set_cuda_environment(environ=None) -> str:
    """CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set (a value of your own wins, and torch checks it).
    Call before CUDA's first use. Returns the value in effect."""
    environ = os.environ if environ is None else environ
    name, value = CUBLAS_WORKSPACE
    environ.setdefault(name, value)
    return environ[name]


def engine_environment(capability: tuple[int, int] | None, engine: str, environ=None) -> str | None:
    """Set VLLM_BATCH_INVARIANT=1 where the colocated vLLM can use it (`engine` "vllm" on a GPU of
    `capability` >= 9.0; `capability` None: a CPU), before `import vllm`. A value you set wins.
    Returns why vLLM's batching stays unpinned (None: pinned, or no vLLM in this run)."""
    environ = os.environ if environ is None else environ
    if engine != "vllm":
        return None
    if capability is None:
        return "vLLM's batching (batch-invariant kernels are for NVIDIA GPUs; vLLM-CPU's kernels run as they are)"
    if tuple(capability) < MIN_BATCH_INVARIANT_CAPABILITY:
        need = ".".join(map(str, MIN_BATCH_INVARIANT_CAPABILITY))
        return (f"vLLM's batching (its batch-invariant kernels need compute capability {need}; this GPU has "
                f"{capability[0]}.{capability[1]})")
    environ.setdefault(BATCH_INVARIANT, "1")
    if environ[BATCH_INVARIANT] != "1":
        return f"vLLM's batching ({BATCH_INVARIANT}={environ[BATCH_INVARIANT]} is set in the environment)"
    return None


def cuda_capability(device) -> tuple[int, int] | None:
    """The compute capability of `device` (a torch.device), None for a CPU."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch  # noqa: PLC0415

    return tuple(torch.cuda.get_device_capability(device))


def enable(seed: int) -> None:
    """torch's deterministic algorithms, cuDNN deterministic without benchmarking, and every global
    generator seeded from `seed`."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device's default generator (CUDA's too, lazily)


def prepare(*, seed: int, device, engine: str, threads: int, environ=None) -> Pinned:
    """Everything the mode sets for a local run on `device` (torch.device) with rollout `engine`
    ("hf" or "vllm", resolved), before vLLM is imported: the environment, torch's flags, the seeds.
    `threads`: the --threads option (0: chosen from the free cores at start). Returns what it pinned
    and what it could not, for the start line and config.json."""
    environ = os.environ if environ is None else environ
    out = Pinned()
    if getattr(device, "type", str(device)) == "cuda":  # before the capability query, CUDA's first use here
        out.pinned.append(f"CUBLAS_WORKSPACE_CONFIG={set_cuda_environment(environ)}")
    capability = cuda_capability(device)
    unpinned = engine_environment(capability, engine, environ)
    if engine == "vllm" and unpinned is None:
        out.pinned.append(f"{BATCH_INVARIANT}=1 (vLLM's batch-invariant kernels, beta)")
    enable(seed)
    out.pinned.append("torch deterministic algorithms" + (", cuDNN deterministic" if capability else ""))
    out.pinned.append(f"global generators seeded ({seed})")
    if unpinned:
        out.not_pinned.append(unpinned)
    if capability is None and threads == 0:
        out.not_pinned.append("the thread count (--threads 0 takes the cores free at start: give --threads N)")
    kind = "GPU model and driver" if capability is not None else "CPU kind"
    out.not_pinned.append(f"another machine (a seed pins a run on the same {kind}, software versions and settings)")
    return out


def check_engine(pinned: Pinned) -> None:
    """After the engine is built: a vLLM that does not know VLLM_BATCH_INVARIANT (releases before its
    batch-invariant mode) ignored it, and its batching is not pinned."""
    envs = sys.modules.get("vllm.envs")
    item = next((p for p in pinned.pinned if p.startswith(BATCH_INVARIANT)), None)
    if item is None or envs is None:
        return
    if BATCH_INVARIANT not in getattr(envs, "environment_variables", {}):
        pinned.pinned.remove(item)
        pinned.not_pinned.insert(0, f"vLLM's batching (this vLLM has no {BATCH_INVARIANT})")


# torch's messages when determinism cannot be had (aten's alert_not_deterministic and the cuBLAS check).
_NOT_DETERMINISTIC = re.compile(r"does not have a deterministic implementation|CUBLAS_WORKSPACE_CONFIG|"
                                r"Deterministic behavior was enabled")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


@contextlib.contextmanager
def one_line_errors(enabled: bool):
    """Under --deterministic, torch's "no deterministic implementation" errors (raised at the op that
    has none, possibly mid-run) become one `ConfigError` line naming the op and the way out."""
    try:
        yield
    except RuntimeError as e:
        if not enabled or not _NOT_DETERMINISTIC.search(str(e)):
            raise
        said = _first_sentence(str(e))
        if "CUBLAS_WORKSPACE_CONFIG" in str(e):  # the fix is in the message's last sentence: name it
            said += (f" cuBLAS needs CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE[1]} (or :16:8) before CUDA's first "
                     f"use; this process has {os.environ.get(CUBLAS_WORKSPACE[0])!r}.")
        raise ConfigError(f"--deterministic cannot be honoured here: torch says: {said} "
                          "Run without --deterministic (a seed then does not pin a GPU run)") from None


__all__ = ["Pinned", "check_engine", "cuda_capability", "enable", "engine_environment", "one_line_errors", "prepare",
           "set_cuda_environment"]
