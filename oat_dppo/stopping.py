"""How a run stops, on both backends: the signals, the exit status, and what can still be said.

| how the run ended | exit status |
|---|---|
| it finished | 0 |
| it failed (a crash; on Oat a node that ended while nothing asked it to) | 1 |
| bad input, before anything started | 2 |
| SIGHUP (its terminal or ssh session closed) | 129 |
| SIGINT (Ctrl-C) | 130 |
| SIGTERM (SLURM's time limit, `docker stop`, Kubernetes) | 143 |

A signal gives the shell's 128 + its number, so a scheduler or a wrapper script (the study runner too)
tells a preempted run from a finished one. The first stop signal decides the status; what a run does
before it returns (finish the update, save a checkpoint, stop the nodes) is the backend's.

A closed terminal: the kernel sends SIGHUP, and from then on every write to that terminal fails with
EIO, a progress bar's and a closing line's alike. `StopSignals` then points stdout and stderr at
/dev/null, so the run still saves its checkpoint and exits 129 with nothing to print to.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def stop_status(sig: int) -> int:
    """The exit status of a run stopped by `sig`: 128 + its number (SIGHUP 129, SIGINT 130, SIGTERM 143)."""
    return 128 + int(sig)


def terminal_gone() -> bool:
    """Whether stdout or stderr is a terminal that was hung up. An empty write fails on a hung-up terminal
    (and nowhere else); `isatty` cannot tell, it answers False there."""
    for fd in (1, 2):
        try:
            os.write(fd, b"")
        except OSError:
            return True
    return False


def silence_output() -> None:
    """Point stdout and stderr at /dev/null: every later write, Python's or a library's, succeeds."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def say(text: str, file=None) -> None:
    """Print `text` on the stop path, where the terminal may be gone: a failed write silences the output
    instead of raising inside a signal handler or on the way out."""
    try:
        print(text, file=file or sys.stderr, flush=True)
    except OSError:
        silence_output()


class StopSignals:
    """SIGHUP, SIGINT and SIGTERM handled inside the `with`, the previous handlers restored after it.

        with StopSignals(on_stop) as stop:   # on_stop(sig) runs on every stop signal, in the main thread
            ...
        status = stop_status(stop.first) if stop.first else 0

    `first` is the first signal received (it gives the exit status). A SIGHUP whose terminal is gone
    silences stdout and stderr before `on_stop` runs."""

    def __init__(self, on_stop: Callable[[signal.Signals], None]):
        self.on_stop = on_stop
        self.first: signal.Signals | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame=None) -> None:
        sig = signal.Signals(signum)
        if self.first is None:
            self.first = sig
        if sig == signal.SIGHUP and terminal_gone():
            silence_output()
        self.on_stop(sig)


# ---------------------------------------------------------------------------------------------
# A launcher's processes end with it, even when it is SIGKILLed
# ---------------------------------------------------------------------------------------------

#: Carried by every process a guarded launcher starts (they inherit its environment).
RUN_MARKER_ENV = "OAT_DPPO_RUN_MARKER"
KILL_AFTER_S = 10.0


def end_children_with_this_process() -> str:
    """Mark this process's environment, so every process it starts from now on carries the marker, and
    start a watchdog that outlives it: once this process is gone, however it ended (the OOM killer and
    `kill -9` included), the watchdog sends SIGTERM to every process carrying the marker and SIGKILL to
    those left `KILL_AFTER_S` later. Processes that do not watch their parent (Oat's nodes behind
    launchpad's shell wrappers, the plasma store) thus never outlive their launcher. Returns the marker."""
    import subprocess  # noqa: PLC0415
    import uuid  # noqa: PLC0415

    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != RUN_MARKER_ENV}  # the watchdog is not one of them
    subprocess.Popen([sys.executable, "-m", "oat_dppo.stopping", str(os.getpid()), marker], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)  # its own session: a signal to the launcher's group spares it
    os.environ[RUN_MARKER_ENV] = marker
    return marker


def marked_processes(marker: str, name: str = RUN_MARKER_ENV) -> list[int]:
    """The live processes (zombies excluded) whose environment has `name`=`marker`."""
    needle = f"{name}={marker}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                if f.read().rsplit(b") ", 1)[-1].startswith(b"Z"):
                    continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(entry.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return out


def _watch(pid: int, marker: str) -> None:
    """The watchdog: wait for `pid` to end (a pidfd: no confusion with a later process of the same number),
    then end every process carrying `marker`."""
    import select  # noqa: PLC0415
    import time  # noqa: PLC0415

    try:
        select.select([os.pidfd_open(pid)], [], [])  # readable once the process has ended
    except ProcessLookupError:  # already gone
        pass
    except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): poll
        while _exists(pid):
            time.sleep(1.0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = marked_processes(marker)
        for p in left:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        deadline = time.monotonic() + KILL_AFTER_S
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = marked_processes(marker)
        if not left:
            return


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if __name__ == "__main__":  # the watchdog of `end_children_with_this_process`
    _watch(int(sys.argv[1]), sys.argv[2])
