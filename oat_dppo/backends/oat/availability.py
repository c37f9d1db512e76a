"""Is the Oat stack here? Checked by installed distributions, not by `find_spec`.

Why: the test suite's import-boundary fakes for `vllm` and `launchpad` (tests/oat_fakes) are
process-global, so `import vllm` succeeds inside pytest on a CPU machine. A fake has no
distribution metadata, so `importlib.metadata` tells the truth. Cheap: nothing is imported unless
every package is present (then torch, for CUDA).
"""

from __future__ import annotations

import importlib.metadata

from oat_dppo.config import ConfigError  # tyro and the standard library

GPU_GUIDE = "docs/gpu.md"

# (distribution names to try, what to tell the user)
_REQUIRED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("oat-llm",), "oat-llm==0.2.4"),
    (("vllm",), "vllm==0.8.4"),
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
    """What the Oat backend needs that this machine lacks (empty: everything is here)."""
    out = missing_packages()
    try:
        import torch  # only once the Oat stack is known to be installed
    except ImportError:
        return out + ["torch"]
    if not torch.cuda.is_available():
        out.append("a CUDA GPU")
    return out


def require() -> None:
    """Raise `ConfigError` naming what the Oat backend lacks on this machine (if anything)."""
    lacking = missing()
    if lacking:
        raise ConfigError(f"--backend oat needs {', '.join(lacking)}, which this machine lacks. The GPU install "
                          f"guide is {GPU_GUIDE}; --backend local runs here.")
