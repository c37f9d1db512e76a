"""How a launcher of Oat's program ends: every node of its group (IPC server, vLLM actors, DeepSpeed
learners) ended, with `oat_dppo.stopping`'s exit status: 0 once every learner returned from its `run()`, 1
when a node ended unasked (a crash, the OOM killer, a lost peer group), 128 + n for a stop signal.

Oat's learner ends the program with `lp.stop()`, a SIGTERM to its launcher (the very signal a scheduler
sends) that other node groups never get. Here it does nothing (`finish_without_stop`): a learner whose
`run()` returned leaves a marker file (`run_then_report`), and the launcher ends the group once every
learner left one. A SIGKILLed launcher's nodes end by `stopping`'s watchdog. See docs/oat.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from oat_dppo import patches
from oat_dppo.stopping import RUN_MARKER_ENV, StopSignals, end_children_with_this_process, say
from oat_dppo.stopping import stop_status

#: Set by the launcher for its node processes: where learners leave their "finished" markers.
FINISHED_DIR_ENV = "OAT_DPPO_FINISHED_DIR"
EXIT_DONE, EXIT_NODE_FAILED = 0, 1



@contextlib.contextmanager
def finish_without_stop():
    """Inside, in a learner launched by `Supervisor`: Oat's `lp.stop()` at the end of `LearnerBase.run`
    does nothing. Under any other launcher (Oat's own entry points) nothing changes."""
    if not os.environ.get(FINISHED_DIR_ENV):
        yield
        return
    with patches.oat_learner_without_stop():
        yield


def run_then_report(learner, run) -> None:
    """A learner node's life: `run()` (Oat's `LearnerBase.run`) with `lp.stop()` disarmed, then its marker
    for the launcher, named after its node (`get_program` labels the i-th learner of group g learner_g_i)."""
    with finish_without_stop():
        run()
    args, folder = learner.args, os.environ.get(FINISHED_DIR_ENV)
    if folder:  # launched by `Supervisor`
        index = learner.strategy.get_rank() - args.group_rank * args.learner_gpus_per_group
        Path(folder, f"learner_{args.group_rank}_{index}.finished").touch()



class Stopped(BaseException):
    """A stop signal came before any node process started: there is nothing to stop."""

    def __init__(self, sig: signal.Signals):
        super().__init__(sig.name)
        self.signal = sig


class Supervisor:
    """The launcher's watch over one node group, from before anything is built to the last node's end.

        with Supervisor() as sup:      # SIGHUP / SIGINT / SIGTERM recorded from here on
            ...build the program...    # a signal here raises `Stopped` (nothing started yet)
            status = sup.run(program, resources)

    `failure_hint` is added to the line that names a crashed node (e.g. that a lost peer group makes
    a learner fail)."""

    def __init__(self, *, failure_hint: str = "", poll_s: float = 0.5):
        self.failure_hint = failure_hint
        self.poll_s = poll_s
        self.stop = StopSignals(self._on_signal)
        self.manager = None  # launchpad's WorkerManager, once lp.launch returned
        self._launching = False
        self._finished_dir: str | None = None

    def __enter__(self) -> "Supervisor":
        self.stop.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.__exit__()
        if self._finished_dir:
            shutil.rmtree(self._finished_dir, ignore_errors=True)
            os.environ.pop(FINISHED_DIR_ENV, None)
            os.environ.pop(RUN_MARKER_ENV, None)  # a later launch from this process marks its own nodes

    def _on_signal(self, sig: signal.Signals) -> None:
        # For SIGINT and SIGTERM launchpad's dispatcher calls this (registered before it, so chained) and
        # then stops the nodes itself; SIGHUP it does not handle.
        if self.manager is None and not self._launching:
            raise Stopped(sig)
        if sig == signal.SIGHUP and self.manager is not None:
            self.manager._stop()

    def run(self, program, resources) -> int:
        """Launch `program` with launchpad's `local_mp`, watch its nodes until all have ended; the exit
        status (module docstring)."""
        import launchpad as lp

        self._finished_dir = tempfile.mkdtemp(prefix="oat_dppo_finished_")
        os.environ[FINISHED_DIR_ENV] = self._finished_dir  # node processes inherit the launcher's environment
        end_children_with_this_process()  # the nodes end with this launcher, even if it is SIGKILLed
        self._launching = True
        manager = lp.launch(program, launch_type="local_mp", local_resources=resources, terminal="current_terminal")
        self.manager, self._launching = manager, False
        patches.launcher_survives_node_kill(manager)  # the exit status below must be this process's to give
        if self.stop.first is not None:  # it came while the nodes were starting
            manager._stop()
        # launchpad's own bookkeeping (0.5.2, pinned): "label/index" -> psutil.Process of each node's wrapper
        label_of = {id(p): name.split("/")[0] for name, procs in manager._active_workers.items() for p in procs}
        learners = {label for label in label_of.values() if label.startswith("learner_")}
        status: int | None = None
        while True:
            time.sleep(self.poll_s)
            with manager._mutex:  # as launchpad's WorkerManager.wait does
                before = _alive(manager)
                manager._check_workers()  # reaps ended nodes; turns launchpad's kill alarm off once none is left
                alive = _alive(manager)
            if status is None:
                status = self._outcome(learners, {label_of[p] for p in before - alive})
            if not alive:
                break
        assert status is not None  # the poll that saw the last node go decided it
        if status == EXIT_DONE:
            how = "every learner finished"
        elif status == EXIT_NODE_FAILED:
            how = "a node failed"
        else:
            how = f"stopped by {self.stop.first.name}" + (" (Ctrl-C)" if self.stop.first == signal.SIGINT else "")
        say(f"oat_dppo: {how}; every node process has ended (exit status {status})")
        return status

    def _outcome(self, learners: set[str], gone: set[str]) -> int | None:
        """The run's exit status once known (stopping the nodes where this launcher must), else None."""
        if self.stop.first is not None:
            return stop_status(self.stop.first)
        finished = {p.stem for p in Path(self._finished_dir).glob("*.finished")}
        if learners and learners <= finished:  # checked first: a learner leaves its marker, then exits
            self.manager._stop()  # the actors and the IPC server never end by themselves
            return EXIT_DONE
        crashed = sorted(gone - finished)
        if crashed:
            hint = f"; {self.failure_hint}" if self.failure_hint else ""
            say(f"oat_dppo: node {crashed[0]} ended while the program was running: it failed (its own log lines, "
                f"prefixed [{crashed[0]}], say why{hint}); stopping the other nodes")
            self.manager._stop()
            return EXIT_NODE_FAILED
        return None


def _alive(manager) -> set[int]:
    return {id(p) for procs in manager._active_workers.values() for p in procs}


__all__ = ["EXIT_DONE", "EXIT_NODE_FAILED", "FINISHED_DIR_ENV", "Stopped", "Supervisor", "finish_without_stop",
           "run_then_report"]
