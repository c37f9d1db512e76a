"""The environment for a child `python -m oat_dppo...` in tests: the parent's import path included
(a machine that installs packages by PYTHONPATH, such as the GPU kit, would otherwise lose them)."""

from __future__ import annotations

import os
import sys


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    paths = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env
