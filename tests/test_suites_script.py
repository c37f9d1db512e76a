"""setup/test_suites.sh, what `make test` runs: the suite in .venv and the one on Oat's stack side by side. Its exit
status is what lets a commit land, so a failure in either suite must fail it, and the background suite's output must
be printed. Driven here with stand-in venvs whose `python` records its arguments and exits as told."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "setup" / "test_suites.sh"


def oat_stack_possible() -> bool:
    return subprocess.run([str(REPO / "setup" / "oat_venv.sh"), "--possible"], capture_output=True).returncode == 0


def stand_in_venv(root: Path, name: str, status: int) -> Path:
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "{name} ran: $*"\nexit {status}\n')
    python.chmod(0o755)
    return venv


def suites(tmp_path: Path, venv_status: int, oat_status: int, **env: str) -> subprocess.CompletedProcess:
    venv, oat = stand_in_venv(tmp_path, "venv", venv_status), stand_in_venv(tmp_path, "oat", oat_status)
    child = {k: v for k, v in os.environ.items() if k != "CI"}
    child.update(VENV=str(venv), OAT_VENV=str(oat), MAKE="true", **env)  # `true setup-oat`: the stand-in is built
    return subprocess.run([str(SCRIPT), "not slow", "not slow and not one_stack"], capture_output=True, text=True,
                          env=child, timeout=60)


@pytest.mark.skipif(not oat_stack_possible(), reason="this machine cannot build Oat's stack: one suite runs")
@pytest.mark.parametrize("venv_status, oat_status", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_both_suites_run_with_their_markers_and_either_failure_fails_the_script(tmp_path, venv_status, oat_status):
    done = suites(tmp_path, venv_status, oat_status)
    assert "venv ran: -m pytest -m not slow" in done.stdout
    # the background suite's log is printed after the foreground one
    assert done.stdout.index("venv ran:") < done.stdout.index("oat ran: -m pytest -m not slow and not one_stack")
    assert f"exit status {venv_status}, " in done.stdout and f"exit status {oat_status}" in done.stdout
    assert (done.returncode == 0) == (venv_status == oat_status == 0)


def test_where_oats_stack_cannot_be_built_one_line_says_why_and_ci_fails(tmp_path):
    if oat_stack_possible():
        # a PATH without a Python 3.10 and a pyenv root without versions: the check says why
        no_python310 = {"PYENV_ROOT": str(tmp_path / "no-pyenv"), "HOME": str(tmp_path), "PYTHON310": "",
                        "PATH": "/usr/bin:/bin"}
        if subprocess.run(["bash", "-c", "command -v python3.10"], env=no_python310).returncode == 0:
            pytest.skip("/usr/bin has a python3.10: no way to hide it here")
    else:
        no_python310 = {}
    done = suites(tmp_path, 0, 0, **no_python310)
    assert done.returncode == 0 and "note: skipping the suite on Oat's stack" in done.stdout
    assert "oat ran" not in done.stdout
    in_ci = suites(tmp_path / "ci", 0, 0, CI="true", **no_python310)
    assert in_ci.returncode != 0 and "CI must run it" in in_ci.stderr
