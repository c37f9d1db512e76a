"""Import-boundary fakes for the two packages that cannot exist on a CPU machine: ``vllm`` and
``launchpad`` (project rule: these two, and nothing else, may be faked in tests).

``install()`` makes them importable *only where the real package is missing*: it appends this
folder to the end of ``sys.path``, so a real ``vllm``/``launchpad`` installed in site-packages is
always found first. Call it before importing any ``oat`` module. See docs/dev_oat_cpu.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys

FAKES_DIR = os.path.dirname(os.path.abspath(__file__))
FAKED = ("vllm", "launchpad")


def install() -> dict[str, bool]:
    """Make ``vllm`` and ``launchpad`` importable; return ``{name: True if the fake is used}``."""
    if FAKES_DIR not in sys.path:
        sys.path.append(FAKES_DIR)  # appended: real packages earlier on sys.path win
    importlib.invalidate_caches()
    return {name: is_fake(name) for name in FAKED}


def is_fake(name: str) -> bool:
    """Whether ``import name`` resolves (or already resolved) to the fake in this folder."""
    mod = sys.modules.get(name)
    if mod is not None:
        return bool(getattr(mod, "__oat_dppo_fake__", False))
    spec = importlib.util.find_spec(name)
    return spec is not None and bool(spec.origin) and os.path.dirname(os.path.dirname(spec.origin)) == FAKES_DIR
