"""The environment for a child `python` started by a test."""

from __future__ import annotations

import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _keep(p: str, with_tests: bool) -> bool:
    p = os.path.abspath(p)
    if p == TESTS:
        return with_tests
    return not p.startswith(TESTS + os.sep)  # tests/helpers and the like: only a child that asks for them


def child_env(*, with_tests: bool = True, **env: str) -> dict[str, str]:
    """os.environ plus `env` (and HF_HUB_OFFLINE=1), with this process's sys.path first on PYTHONPATH.

    A child must import what the test imports: where packages are installed by PYTHONPATH (the GPU
    kit) or the code under test is put first that way, a child given a fresh PYTHONPATH finds other
    code or none. `with_tests=False` leaves tests/ out too, for a child that must see only real packages.
    """
    path = [p for p in sys.path if p] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    path = [p for p in dict.fromkeys(path) if p and _keep(p, with_tests)]
    return {**os.environ, "HF_HUB_OFFLINE": "1", **env, "PYTHONPATH": os.pathsep.join(path)}
