"""Running a study's runs: their state on disk, their commands, the local scheduler, the Oat script.

A run's state comes from its directory `<out>/<run name>`:

* done     metrics.jsonl has every iteration 0..iterations-1, in the run directory or in the run's
           committed copy (`[study] results`, oat_dppo.study.committed): skipped
* resume   a checkpoint, not done: `python -m oat_dppo.main --resume DIR --iterations N`
* restart  metrics but no checkpoint to resume from (interrupted before its first save): started over
* new      nothing yet (or only config.json): started

Children run in their own session (a terminal's Ctrl-C reaches only this process) and write to
`<out>/<run name>.log`. Ctrl-C here sends each child one SIGINT: it finishes its update, saves a
checkpoint and exits; a second Ctrl-C forwards a second SIGINT (stop now), a third kills.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from oat_dppo.stopping import STOP_SIGNALS, stop_status
from oat_dppo.plot.data import read_metrics
from oat_dppo.rundir import RunDir, checkpoint_exists, checkpoint_iteration
from oat_dppo.study.committed import commit
from oat_dppo.study.spec import RunSpec, Study, config_differences, option_args

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
SCRIPT_NAME = "launch_oat.sh"
POLL_S = 0.5


# ---- state --------------------------------------------------------------------------------------


@dataclass
class RunState:
    status: str  # "done" | "resume" | "restart" | "new"
    iterations_done: int  # distinct iterations in metrics.jsonl
    last_reward: float | None
    committed: bool = False  # done by its committed copy (another machine or clone ran it)
    resume_from: int | None = None  # "resume": iterations its checkpoint holds (None: not readable here)

    @property
    def resume_at(self) -> int:
        """Iterations a resume starts after: the checkpoint's, else what metrics.jsonl logged."""
        return self.iterations_done if self.resume_from is None else self.resume_from


def _quiet(_msg: str) -> None:
    pass


class Progress(NamedTuple):
    iterations: list[int]  # iterations logged
    reward: float | None  # the latest rollout/reward_mean
    iteration_s: float | None  # mean time/iteration_s of the last few iterations


def read_progress(run_dir: Path, recent: int = 3) -> Progress:
    """What a run directory's metrics.jsonl says of its progress."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return Progress([], None, None)
    table = read_metrics(path, warn=_quiet)
    its = [int(i) for i in table.iterations]

    def finite(key: str) -> list[float]:
        return [float(v) for v in table.column(key) if v == v] if len(table) else []

    rewards, times = finite("rollout/reward_mean"), finite("time/iteration_s")[-recent:]
    return Progress(its, rewards[-1] if rewards else None, sum(times) / len(times) if times else None)


def mean_iteration_s(run_dir: Path) -> float | None:
    """Mean `time/iteration_s` over every iteration a run directory's metrics.jsonl logged."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    times = [float(v) for v in read_metrics(path, warn=_quiet).column("time/iteration_s") if v == v]
    return sum(times) / len(times) if times else None


class TimeLeft(NamedTuple):
    seconds: float  # wall time until the last run ends
    timed_runs: int  # runs whose logged iterations set the pace
    this_machine: bool = False  # those runs ran on the machine asking (else on others: a guess)


# What tells machines' paces apart: the CPU (the GPU is known only to a process that loaded torch).
PACE_KEYS = ("cpu", "cpu_native_bf16", "cpu_cores")


def ran_on(run_dir: Path, here: dict) -> bool:
    """Whether the `_machine` record in a run directory's config.json names the CPU of `here`."""
    try:
        record = json.loads((run_dir / "config.json").read_text()).get("_machine")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(record, dict) and all(record.get(k) == here.get(k) for k in PACE_KEYS)


def time_left(runs: list[RunSpec], states: dict[str, RunState], parallel: int,
              here: dict | None = None) -> TimeLeft | None:
    """The wall time the runs not done yet need, `parallel` at a time in run order, at the pace the
    runs themselves logged (seconds per iteration): a run's own grid point but for the seed where one
    of its seeds has timings (its engine and trust region set the pace), else the mean of all timed
    runs. None when no run logged a timing. A committed run's pace is that of the machine that ran
    it: where some runs ran on `here` (this machine's `provenance.machine()` record: its CPU), only
    they set the pace (a vLLM-CPU iteration of the CPU study took 190 s on an AMD EPYC without native
    bf16 and 40 s on a Xeon with AMX)."""
    def point(run: RunSpec) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in run.grid.items() if k != "seed"))

    logged: list[tuple[tuple, float, bool]] = []  # (grid point, pace, ran here)
    for run in runs:
        st = states[run.name]
        where = run.results_dir if st.committed and run.results_dir else run.run_dir
        pace = mean_iteration_s(where)
        if pace is not None:
            logged.append((point(run), pace, here is not None and ran_on(where, here)))
    this_machine = any(ran_here for *_, ran_here in logged)
    paces: dict[tuple, list[float]] = {}
    for key, pace, ran_here in logged:
        if ran_here or not this_machine:
            paces.setdefault(key, []).append(pace)
    timed = [x for xs in paces.values() for x in xs]
    if not timed:
        return None
    slots = [0.0] * max(1, parallel)  # when each slot frees up
    for run in runs:
        st = states[run.name]
        left = 0 if st.status == "done" else run.config.iterations - (st.resume_at if st.status == "resume" else 0)
        if left <= 0:
            continue
        own = paces.get(point(run))
        pace = sum(own) / len(own) if own else sum(timed) / len(timed)
        i = slots.index(min(slots))
        slots[i] += left * pace
    return TimeLeft(max(slots), len(timed), this_machine)


def has_checkpoint(run_dir: Path) -> bool:
    return checkpoint_exists(run_dir / "checkpoint")


def run_state(run: RunSpec) -> RunState:
    its, reward, _ = read_progress(run.run_dir)
    if set(range(run.config.iterations)) <= set(its):
        return RunState("done", len(its), reward)
    if run.results_dir is not None:
        committed_its, committed_reward, _ = read_progress(run.results_dir)
        if set(range(run.config.iterations)) <= set(committed_its):
            return RunState("done", len(committed_its), committed_reward, committed=True)
    if has_checkpoint(run.run_dir):
        last = checkpoint_iteration(run.run_dir / "checkpoint")
        return RunState("resume", len(its), reward, resume_from=None if last is None else last + 1)
    if its:
        return RunState("restart", len(its), reward)
    return RunState("new", 0, None)


def conflicts(runs: list[RunSpec]) -> list[str]:
    """Runs whose existing directory, or committed copy, holds a run of another configuration (a
    study edited since)."""
    problems = []
    for run in runs:
        for where, fix in ((run.run_dir, "give the study another [study] out"),
                           (run.results_dir, "give the study another [study] results")):
            if where is None:
                continue
            path = where / "config.json"
            if not path.is_file() or not (where / "metrics.jsonl").exists() and not has_checkpoint(where):
                continue
            try:
                saved = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            diffs = config_differences(saved, run)
            if diffs:
                problems.append(f"{where} holds a run with another configuration ({'; '.join(diffs)}): "
                                f"delete that directory, or {fix}")
    return problems


def commit_finished(runs: list[RunSpec]) -> list[RunSpec]:
    """Commit every finished run not yet (fully) in its committed copy; returns those copied."""
    return [run for run in runs if commit(run)]


# ---- commands -----------------------------------------------------------------------------------


def main_command(run: RunSpec, *, resume: bool = False, backend: str = "local", python: str = "python") -> list[str]:
    """The `python -m oat_dppo.main` command line of a run (resume: continue its checkpoint)."""
    cmd = [python, "-m", "oat_dppo.main"]
    if resume:
        cmd += ["--resume", str(run.run_dir), "--iterations", str(run.config.iterations)]
    else:
        cmd += option_args(run.options) + ["--run-dir", str(run.run_dir)]
    cmd += ["--backend", backend]
    if backend == "local":
        if resume or "threads" not in run.options:
            cmd += ["--threads", str(run.config.threads)]
        cmd.append("--no-progress")
    return cmd


def log_path(run: RunSpec) -> Path:
    return run.run_dir.with_name(run.run_dir.name + ".log")


def write_oat_script(study: Study, runs: list[RunSpec]) -> Path:
    """`<out>/launch_oat.sh`: one `python -m oat_dppo.main --backend oat ...` line per run."""
    study.out.mkdir(parents=True, exist_ok=True)
    path = study.out / SCRIPT_NAME
    lines = [
        "#!/usr/bin/env bash",
        f"# Study {study.name}: {len(runs)} runs on the Oat backend, from {study.path}.",
        "# Generated by `python -m oat_dppo.study`; run it from the repository root on the GPU machine.",
        "# Oat keeps DeepSpeed checkpoints only with --save-ckpt (add it to a line, with --save-every N);",
        "# continue an interrupted run with that line plus",
        "#   --resume-dir <its --run-dir>/<wb-run-name>_<start time>/checkpoints",
        "# (Oat 0.2.4 restores the weights and optimizer; its step counter and prompt order start over).",
        f"# Then aggregate: python -m oat_dppo.study {study.path} --report",
        "set -u",
        "",
    ]
    for run in runs:
        lines.append(shlex.join(main_command(run, backend="oat")))
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


# ---- the local scheduler ------------------------------------------------------------------------


def clock(seconds: float) -> str:
    """H:MM:SS."""
    s = int(seconds)
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _reward(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


@dataclass
class _Child:
    run: RunSpec
    proc: subprocess.Popen
    log: IO
    started: float
    seen: tuple[float, int] = (0.0, -1)  # metrics.jsonl (mtime, size) last read
    reported: int = 0  # iterations done at the last progress line (a resume: its checkpoint's)


def stopped_by_signal(code: int, stopping: bool) -> bool:
    """Did a stop signal end the run (stopped: to resume), rather than its end (done) or a fault (failed)?
    `code` is the child's exit status: a run's own status for a stop (`stop_status`: 129, 130, 143) or
    the signal itself (-1, -2, -15), whoever sent it (this runner, a scheduler, a closed terminal);
    SIGKILL (-9) only while this runner is stopping (its last resort), else it is the OOM killer's."""
    if code in {stop_status(s) for s in STOP_SIGNALS} or code in {-int(s) for s in STOP_SIGNALS}:
        return True
    return stopping and code == -signal.SIGKILL


class LocalRunner:
    """Runs a study's runs as `python -m oat_dppo.main` subprocesses, `parallel` at a time."""

    def __init__(self, study: Study, runs: list[RunSpec], *, parallel: int, out: IO = sys.stdout,
                 continue_hint: str = "", python: str = sys.executable):
        self.study = study
        self.runs = runs
        self.parallel = max(1, parallel)
        self.out = out
        self.continue_hint = continue_hint
        self.python = python
        self.t0 = time.monotonic()
        self.done: list[str] = []
        self.failed: list[str] = []
        self.interrupted: list[str] = []
        self.total = len(runs)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _prefix(self) -> str:
        return f"[{clock(time.monotonic() - self.t0)} {len(self.done)}/{self.total} done]"

    def _start(self, run: RunSpec) -> _Child:
        state = run_state(run)
        if state.status == "restart":
            shutil.rmtree(run.run_dir)
        resume = state.status == "resume"
        if resume and state.resume_from is not None:
            # The run trims what it logged after its checkpoint when it starts; trimming here too
            # keeps those stale iterations out of the progress lines until then.
            RunDir(run.run_dir, create=False).truncate_metrics(state.resume_from - 1)
        cmd = main_command(run, resume=resume, python=self.python)
        run.run_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path(run), "a", encoding="utf-8")
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        redo = ""
        if resume and state.iterations_done > state.resume_at:  # logged after the checkpoint: lost
            first, last = state.resume_at + 1, state.iterations_done
            redo = (f" (iteration {first}, logged after that checkpoint, runs again)" if first == last else
                    f" (iterations {first}-{last}, logged after that checkpoint, run again)")
        how = {
            "resume": f"resume after iteration {state.resume_at}/{run.config.iterations}{redo}",
            "restart": "start over (no checkpoint to resume from)",
        }.get(state.status, "start")
        self.say(f"{self._prefix()} {how}: {run.name}")
        return _Child(run, proc, log, time.monotonic(), reported=state.resume_at if resume else 0)

    def _report_progress(self, child: _Child) -> None:
        path = child.run.run_dir / "metrics.jsonl"
        try:
            st = path.stat()
        except OSError:
            return
        if (st.st_mtime, st.st_size) == child.seen:
            return
        child.seen = (st.st_mtime, st.st_size)
        its, reward, iteration_s = read_progress(child.run.run_dir)
        if its and max(its) + 1 > child.reported:  # a new iteration (a resume's rewrite is not one)
            child.reported = done = max(its) + 1
            total = child.run.config.iterations
            left = f", ~{clock(iteration_s * (total - done))} left" if iteration_s and done < total else ""
            self.say(f"{self._prefix()} {child.run.name}: iteration {done}/{total}  reward {_reward(reward)}{left}")

    def _finish(self, child: _Child, code: int, stopping: bool) -> None:
        child.log.close()
        name = child.run.name
        took = clock(time.monotonic() - child.started)
        its, reward, _ = read_progress(child.run.run_dir)
        if code == 0:
            self.done.append(name)
            kept = f"; committed to {child.run.results_dir}" if commit(child.run) else ""
            self.say(f"{self._prefix()} done: {name} ({len(its)} iterations, last reward {_reward(reward)}, {took})"
                     f"{kept}")
        elif stopped_by_signal(code, stopping):
            self.interrupted.append(name)
            saved = "checkpoint saved" if has_checkpoint(child.run.run_dir) else "no checkpoint yet"
            self.say(f"{self._prefix()} stopped: {name} after {len(its)} iterations ({saved})")
        else:
            self.failed.append(name)
            tail = _tail(log_path(child.run), 8)
            self.say(f"{self._prefix()} FAILED (exit {code}): {name}; log: {log_path(child.run)}")
            for line in tail:
                self.say(f"    | {line}")

    def run(self) -> int:
        queue = list(self.runs)
        running: list[_Child] = []
        self._signals = 0
        previous = {}
        for sig in STOP_SIGNALS:  # counted, never raised: no child can go unrecorded
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: Ctrl-C stays a KeyboardInterrupt
                break
        try:
            while (queue or running) and not self._signals:
                while queue and len(running) < self.parallel and not self._signals:
                    running.append(self._start(queue.pop(0)))
                time.sleep(POLL_S)
                for child in list(running):
                    self._report_progress(child)
                    code = child.proc.poll()
                    if code is not None:
                        running.remove(child)
                        self._finish(child, code, stopping=False)
        except KeyboardInterrupt:
            self._signals += 1
        try:
            if self._signals:
                self._stop(running)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        elapsed = clock(time.monotonic() - self.t0)
        if self._signals:
            self.say(
                f"\ninterrupted after {elapsed}: {len(self.done)} of {self.total} runs done, "
                f"{len(self.interrupted)} stopped, {len(self.failed)} failed, {len(queue)} not started.\n"
                f"continue with (finished runs are skipped, interrupted ones resumed):\n  {self.continue_hint}"
            )
            return EXIT_INTERRUPTED
        stopped = f", {len(self.interrupted)} stopped by a signal" if self.interrupted else ""
        self.say(f"study {self.study.name}: {len(self.done)} runs done{stopped}, {len(self.failed)} failed in {elapsed}")
        if self.failed:
            self.say("failed runs (logs kept next to their run directories; re-run the same command to retry them):")
            for name in self.failed:
                self.say(f"  {name}  (log: {log_path(next(r for r in self.runs if r.name == name))})")
            return EXIT_FAILED
        if self.interrupted:  # not done: a scheduler, or someone, stopped them
            self.say(f"stopped runs resume with:\n  {self.continue_hint}")
            return EXIT_INTERRUPTED
        return 0

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1

    def _stop(self, running: list[_Child]) -> None:
        """Ctrl-C: one SIGINT to each child (it saves a checkpoint and exits), then wait; another
        Ctrl-C sends a second SIGINT (stop at once, from the last checkpoint), a third SIGKILL."""
        if not running:
            return
        self.say(f"\n{self._prefix()} Ctrl-C: asking {len(running)} running runs to save a checkpoint and stop "
                 "(Ctrl-C again to stop them at once)")
        ladder = [signal.SIGINT, signal.SIGINT, signal.SIGKILL]
        sent = 1
        _signal_all(running, ladder[0])
        while running:
            try:
                time.sleep(POLL_S)
            except KeyboardInterrupt:
                self._signals += 1
            while sent < self._signals and sent < len(ladder):
                what = "stop now" if ladder[sent] == signal.SIGINT else "kill"
                self.say(f"{self._prefix()} Ctrl-C again: {what} ({len(running)} runs)")
                _signal_all(running, ladder[sent])
                sent += 1
            for child in list(running):
                code = child.proc.poll()
                if code is not None:
                    running.remove(child)
                    self._finish(child, code, stopping=True)


def _signal_all(children: list[_Child], sig: int) -> None:
    for child in children:
        if child.proc.poll() is None:
            try:
                child.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def _tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if line.strip()][-n:]


def print_plan(runs: list[RunSpec], states: dict[str, RunState], *, backend: str, out: IO = sys.stdout,
               python: str = "python") -> None:
    """--dry-run: every run's state, name and command."""
    for run in runs:
        st = states[run.name]
        resume = backend == "local" and st.status == "resume"
        label = {"done": "done, committed (skip)" if st.committed else "done (skip)", "resume": f"resume at {st.resume_at}/{run.config.iterations}",
                 "restart": "restart", "new": "new"}[st.status]
        print(f"{run.name}  [{label}]", file=out)
        print(f"    {shlex.join(main_command(run, resume=resume, backend=backend, python=python))}", file=out)
