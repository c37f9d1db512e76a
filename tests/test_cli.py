"""One command-line style for every entry point: `python -m oat_dppo.<name> --help` shows
`python -m oat_dppo.<name>` in its usage line and help text for every option; bad input exits 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tyro
from helpers.child import child_env

REPO = Path(__file__).resolve().parents[1]

ENTRY_POINTS = [
    ("oat_dppo.main", []),
    ("oat_dppo.study", []),
    ("oat_dppo.plot", []),
    ("benchmarks.lab", []),
    ("oat_dppo.envs", []),
    ("oat_dppo.export", []),
    ("benchmarks", []),
    *[("benchmarks", [name]) for name in ("trust-region", "engine", "local", "oat", "head", "gpu", "peers")],
]


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          env=child_env(), timeout=120)


@pytest.mark.parametrize("module, sub", ENTRY_POINTS, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_help_names_the_command_and_a_bad_option_exits_2(module, sub):
    p = run(module, *sub, "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    usage = " ".join(["python -m", module, *sub])
    assert p.stdout.startswith(f"usage: {usage}"), p.stdout[:200]
    assert ".py" not in p.stdout.splitlines()[0]  # no file path in the usage line
    bad = run(module, *sub, "--no-such-option")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("module, sub", [("oat_dppo.main", []), ("benchmarks", [])], ids=["tyro", "bench list"])
def test_help_into_a_closed_pipe_ends_quietly(module, sub):
    """`--help | head -1`: the reader is gone before the text is written; no BrokenPipeError
    traceback, status 0. A pipe whose read end is already closed makes the race certain."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = subprocess.run([sys.executable, "-m", module, *sub, "--help"], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, cwd=REPO, env=child_env(), timeout=120)
    finally:
        os.close(write_end)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]


def _option_helps(config: type) -> dict[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # get_parser is deprecated, the parser it returns is what --help prints
        parser = tyro.extras.get_parser(config)
    return {a.option_strings[0] if a.option_strings else a.dest: re.sub(r"\s*\(default: .*\)$", "", a.help or "",
                                                                          flags=re.S).strip()
            for a in parser._actions if a.option_strings != ["-h", "--help"]}


def _configs():
    from benchmarks import engine, gpu, head, local, oat, peers, trust_region
    from oat_dppo.config import TrainConfig
    from oat_dppo.envs.__main__ import EnvsArgs
    from oat_dppo.export import ExportConfig
    from benchmarks.lab.__main__ import LabArgs
    from oat_dppo.plot.cli import PlotArgs
    from oat_dppo.study.cli import StudyArgs

    return [TrainConfig, StudyArgs, PlotArgs, LabArgs, EnvsArgs, ExportConfig, trust_region.Config, engine.Config,
            local.Config, oat.Config, head.Config, gpu.Config, peers.Config]


@pytest.mark.parametrize("config", _configs(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_option_has_help_text(config):
    helps = _option_helps(config)
    assert helps and not [flag for flag, text in helps.items() if not text], helps


def test_bench_help_opens_with_a_sentence_that_says_what_the_command_does(capsys):
    from benchmarks.__main__ import main as bench_main

    assert bench_main(["--help"]) == 0
    description = capsys.readouterr().out.split("\n\n")[1]  # after the usage line
    assert description[0].isupper() and description.endswith(".") and "\n" not in description, description
    assert "benchmark" in description and "Markdown tables" in description


def test_python_command_names_the_interpreter_to_copy(monkeypatch, tmp_path):
    """Hints print the interpreter a user can paste: `python` only where PATH finds this one."""
    import os
    import shutil
    import sys

    from oat_dppo.cli import python_command

    monkeypatch.setattr(shutil, "which", lambda name: sys.executable)  # an activated venv
    assert python_command() == "python"
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/python")  # another python on PATH
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(sys.executable))))
    assert python_command() == os.path.relpath(sys.executable)
    monkeypatch.chdir(tmp_path)  # outside: the full path
    assert python_command() == sys.executable
