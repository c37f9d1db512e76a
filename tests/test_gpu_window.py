"""A GPU window's archive lands in place with one command (setup/land_gpu_window.py, `make land-gpu`), and
the window script takes its steps in a fixed order (setup/gpu_window.sh, checked here by its dry run)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN = "smollm2__game_GuessTheNumber-v0-easy__pg_is__s3"
STOPPED = "smollm2__game_GuessTheNumber-v0-easy__dppo_binary_tv__s3"


def _lander():
    spec = importlib.util.spec_from_file_location("land_gpu_window", REPO / "setup" / "land_gpu_window.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


land_gpu_window = _lander()


def _metrics(rewards: list[float]) -> str:
    return "".join(json.dumps({"iteration": i, "rollout/reward_mean": r, "rollout/well_formed_rate": 1.0}) + "\n"
                   for i, r in enumerate(rewards))


def fake_archive(path: Path, window: str | None, rewards: list[float], stopped: list[float] = (0.1, 0.2),
                 determinism: str | None = None) -> Path:
    """An archive of setup/gpu_window.sh's layout: one finished run committed under docs/results/, it and
    one stopped run under runs/studies/, the window's stamp under runs/gpu_window/; with `determinism`
    (its determinism.json), the determinism step's folder docs/results/gpu_determinism/ too."""
    files = {}
    if determinism is not None:
        d = "docs/results/gpu_determinism"
        files[f"{d}/determinism.json"] = determinism
        files[f"{d}/determinism.md"] = "# One seed, one run\n"
        for name in ("det_a", "det_b", "plain"):  # runs of their own: not a study's, not in the window's csv
            files[f"{d}/{name}/config.json"] = json.dumps({"trust_region": "pg_is", "seed": 1, "iterations": 2})
            files[f"{d}/{name}/metrics.jsonl"] = _metrics([0.1, 0.2])
    for name, its, tr in ((RUN, rewards, "pg_is"), (STOPPED, list(stopped), "dppo_binary_tv")):
        cfg = json.dumps({"trust_region": tr, "seed": 3, "iterations": len(rewards)})
        files[f"runs/studies/gpu_decisive/{name}/config.json"] = cfg
        files[f"runs/studies/gpu_decisive/{name}/metrics.jsonl"] = _metrics(its)
        files[f"runs/studies/gpu_decisive/{name}.log"] = "a log\n"
    files[f"docs/results/gpu_decisive/{RUN}/config.json"] = files[f"runs/studies/gpu_decisive/{RUN}/config.json"]
    files[f"docs/results/gpu_decisive/{RUN}/metrics.jsonl"] = _metrics(rewards)
    files[f"docs/results/gpu_decisive/{RUN}/responses.jsonl"] = '{"iteration": 0}\n'
    if window:
        files["runs/gpu_window/window.txt"] = f"window={window}\ncommit=abc\n"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def land(archive: Path, root: Path, *args: str) -> tuple[int, str, str]:
    command = [sys.executable, str(REPO / "setup" / "land_gpu_window.py"), str(archive), "--root", str(root), *args]
    proc = subprocess.run(command, capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_window_lands_in_place_and_again_changes_nothing(tmp_path):
    root = tmp_path / "checkout"
    (root / "docs" / "results").mkdir(parents=True)
    archive = fake_archive(tmp_path / "window.tar.gz", "2026-12-01", [0.1, 0.6, -0.1])
    code, out, err = land(archive, root)
    assert code == 0, err
    run = root / "docs/results/gpu_decisive" / RUN
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl", "responses.jsonl"]
    assert f"landed: {run} (3 iterations)" in out
    assert f"gpu_decisive/{STOPPED}: 2 of 3 iterations (stopped)" in out
    assert not (root / "docs/results/gpu_decisive" / STOPPED).exists()  # a stopped run is only in the window's record
    rows = list(csv.DictReader(open(root / "docs/results/gpu_window_2026-12-01.csv")))
    assert [(r["trust_region"], r["iteration"], r["rollout_reward_mean"]) for r in rows] == [
        ("dppo_binary_tv", "0", "0.1"), ("dppo_binary_tv", "1", "0.2"),
        ("pg_is", "0", "0.1"), ("pg_is", "1", "0.6"), ("pg_is", "2", "-0.1")]
    assert (root / "runs/gpu_windows/2026-12-01/studies/gpu_decisive" / f"{STOPPED}.log").is_file()
    before = tree(root / "docs")
    code, out, _ = land(archive, root)
    assert code == 0 and f"already here: {run}" in out and tree(root / "docs") == before


def test_another_windows_draw_of_a_committed_run_is_kept_beside_it_or_refused(tmp_path):
    root = tmp_path / "checkout"
    (root / "docs" / "results").mkdir(parents=True)
    assert land(fake_archive(tmp_path / "a.tar.gz", "2026-12-01", [0.1, 0.6, -0.1]), root)[0] == 0
    committed = root / "docs/results/gpu_decisive" / RUN
    first = tree(committed)
    # The same grid point, run again in another window: a separate draw, kept beside the committed one.
    code, out, err = land(fake_archive(tmp_path / "b.tar.gz", "2026-12-02", [0.1, 0.5, 0.7]), root)
    assert code == 0, err
    draw = root / "docs/results/gpu_window_2026-12-02/gpu_decisive" / RUN
    assert f"kept as a separate draw ({committed} holds another window's run of this grid point): {draw}" in out
    assert tree(committed) == first and '"rollout/reward_mean": 0.7' in (draw / "metrics.jsonl").read_text()
    # A third, different run under the same window's name: nothing is landed, and it says why.
    before = tree(root)
    code, out, err = land(fake_archive(tmp_path / "c.tar.gz", "2026-12-02", [0.2, 0.2, 0.2]), root)
    assert code == 1 and "nothing landed" in err and str(draw) in err and "--window 2026-12-02-b" in err
    assert tree(root) == before


def test_the_determinism_steps_result_lands_whole_and_another_windows_beside_it(tmp_path):
    root = tmp_path / "checkout"
    (root / "docs" / "results").mkdir(parents=True)
    archive = fake_archive(tmp_path / "a.tar.gz", "2026-12-01", [0.1, 0.6, -0.1], determinism='{"complete": true}')
    code, out, err = land(archive, root)
    assert code == 0, err
    step = root / "docs/results/gpu_determinism"
    assert f"landed: {step} (8 files)" in out
    assert sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file()) == [
        "det_a/config.json", "det_a/metrics.jsonl", "det_b/config.json", "det_b/metrics.jsonl",
        "determinism.json", "determinism.md", "plain/config.json", "plain/metrics.jsonl"]
    rows = list(csv.DictReader(open(root / "docs/results/gpu_window_2026-12-01.csv")))
    assert {r["study"] for r in rows} == {"gpu_decisive"}  # the step's runs are not a study's draws
    before = tree(root / "docs")
    code, out, _ = land(archive, root)
    assert code == 0 and f"already here: {step}" in out and tree(root / "docs") == before
    # Another window measured it again (the first was incomplete): kept beside, the first left as it is.
    other = fake_archive(tmp_path / "b.tar.gz", "2026-12-02", [0.1, 0.6, -0.1], determinism='{"complete": false}')
    code, out, err = land(other, root)
    beside = root / "docs/results/gpu_window_2026-12-02/gpu_determinism"
    assert code == 0 and f"kept beside {step}, which holds another window's result: {beside}" in out, err
    assert (step / "determinism.json").read_text() == '{"complete": true}'
    assert (beside / "determinism.json").read_text() == '{"complete": false}'
    third = fake_archive(tmp_path / "c.tar.gz", "2026-12-02", [0.1, 0.6, -0.1], determinism='{"complete": 3}')
    before = tree(root)
    code, _, err = land(third, root)
    assert code == 1 and "gpu_determinism: both" in err and tree(root) == before


def test_the_window_comes_from_the_stamp_the_folder_or_the_command_line(tmp_path):
    root = tmp_path / "checkout"
    (root / "docs" / "results").mkdir(parents=True)
    folder = tmp_path / "2026-12-03"
    folder.mkdir()
    archive = fake_archive(folder / "window.tar.gz", None, [0.1, 0.2, 0.3])
    assert land(archive, root)[0] == 0 and (root / "docs/results/gpu_window_2026-12-03.csv").is_file()
    unnamed = fake_archive(tmp_path / "window.tar.gz", None, [0.1, 0.2, 0.3])
    code, _, err = land(unnamed, root)
    assert code == 1 and "--window YYYY-MM-DD" in err
    assert land(unnamed, root, "--window", "2026-12-04")[0] == 0


def test_an_archive_reaching_outside_the_checkout_is_refused(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(land_gpu_window.LandingError, match="unexpected member"):
        land_gpu_window.land(bad, tmp_path, "2026-12-05")


def test_the_window_script_parses_and_its_dry_run_keeps_the_order(tmp_path):
    script = REPO / "setup" / "gpu_window.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "oat_gpu_window.sh").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "oat_gpu_window.sh").chmod(0o755)  # the Oat step's kit exists; the speed step's does not
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable, OUT=str(tmp_path / "out"),
               WINDOW_DIR=str(tmp_path / "w"), HOOKS=str(hooks), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(script), "600", "6"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    steps = [line.split("] ", 1)[1] for line in proc.stdout.splitlines()]
    order = [next(i for i, s in enumerate(steps) if p in s) for p in  # the decisive study: runs left, or none
             ("oat: would run", "gpu_decisive", "gpu_decisive_control", "determinism: would run", "peers_gtn",
              "speed: skipped", "bench gpu --sections rollout")]
    assert order == sorted(order), steps
    assert not (tmp_path / "out" / "window.tar.gz").exists()  # a dry run packs nothing
    assert 'paths+=("$DETERMINISM_OUT")' in script.read_text()  # its result travels in the archive
    # Asked first, it runs before the Oat step, and once.
    first = subprocess.run(["bash", str(script), "600", "6"], cwd=REPO, env=dict(env, DETERMINISM_FIRST="1"),
                           capture_output=True, text=True)
    steps = [line.split("] ", 1)[1] for line in first.stdout.splitlines()]
    assert [s for s in steps if s.startswith("determinism")] == ["determinism: would run 3 runs of one seed for up "
                                                                 "to 180 s"], steps
    assert steps.index(next(s for s in steps if s.startswith("determinism"))) < steps.index(
        next(s for s in steps if s.startswith("oat:")))


def test_the_window_skips_the_determinism_step_once_its_result_is_complete(tmp_path):
    script = REPO / "setup" / "gpu_window.sh"
    checkout = tmp_path / "checkout"  # the script reads docs/results/gpu_determinism/ of the working directory
    (checkout / "docs/results/gpu_determinism").mkdir(parents=True)
    (checkout / "docs/results/gpu_determinism/determinism.json").write_text('{\n  "complete": true\n}\n')
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable, OUT=str(tmp_path / "out"),
               WINDOW_DIR=str(tmp_path / "w"), HOOKS=str(tmp_path / "none"), DETERMINISM_FIRST="1")
    proc = subprocess.run(["bash", str(script), "600", "6"], cwd=checkout, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "determinism: done (docs/results/gpu_determinism/determinism.json)" in proc.stdout
