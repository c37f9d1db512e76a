"""The stop path both backends share (`oat_dppo.stopping`): a launcher's children end with it, even SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from oat_dppo.stopping import KILL_AFTER_S, marked_processes, stop_status

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from oat_dppo.stopping import end_children_with_this_process
    marker = end_children_with_this_process()
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('ready', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    print(marker, child.pid, flush=True)
    time.sleep(300)
""")


def test_a_sigkilled_parent_leaves_no_child():
    """The parent starts a child that ignores SIGTERM (as a busy node might), then is SIGKILLed: its watchdog
    sends SIGTERM, then SIGKILL after KILL_AFTER_S; nothing of the run is left."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    marker, child = parent.stdout.readline().split()
    assert marked_processes(marker) == [int(child)]
    t0 = time.monotonic()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 30
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = marked_processes(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
    assert time.monotonic() - t0 >= KILL_AFTER_S - 1  # it took the SIGKILL: SIGTERM was ignored


def test_a_parent_that_ends_normally_ends_its_watchdog_too():
    code = "from oat_dppo.stopping import end_children_with_this_process; print(end_children_with_this_process())"
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    marker = parent.stdout.strip()
    deadline = time.monotonic() + 10
    watchdogs = []
    while time.monotonic() < deadline:
        watchdogs = [p for p in os.listdir("/proc") if p.isdigit() and "oat_dppo.stopping" in _cmdline(p)
                     and _cmdline(p).endswith(marker)]
        if not watchdogs:
            break
        time.sleep(0.2)
    assert watchdogs == []


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
    except OSError:
        return ""


def test_stop_status_is_128_plus_the_signal():
    assert [stop_status(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)] == [129, 130, 143]
