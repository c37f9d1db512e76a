"""How many torch threads a run takes when `--threads 0` (auto): the cores other work leaves free.

torch's own default is one thread per core. Two runs side by side then ask for twice the cores there
are, and both crawl: on a 2-core box the README's smoke run took 585 s beside `make run` instead of
13 s (15 s with --threads 1). So auto takes the cores this process may use minus those already busy:
the smaller of the 1-minute load average and the tasks runnable right now (both in /proc/loadavg),
rounded, and never fewer than one.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_cores() -> float:
    """Cores other processes are using now: min(1-minute load average, runnable tasks other than this
    one). 0 where the OS does not say."""
    try:
        fields = open("/proc/loadavg").read().split()
        load, runnable = float(fields[0]), int(fields[3].split("/")[0]) - 1
        return max(0.0, min(load, float(runnable)))
    except (OSError, ValueError, IndexError):
        try:
            return max(0.0, os.getloadavg()[0])
        except (OSError, AttributeError):
            return 0.0


def auto_threads(cores: int, busy: float) -> int:
    """`cores` minus the busy ones (rounded), at least 1."""
    return max(1, min(cores, cores - int(round(busy))))


def choose_threads(requested: int) -> tuple[int, str | None]:
    """(threads, a note for the user or None). `requested` > 0 is taken as it is."""
    if requested > 0:
        return requested, None
    cores, busy = usable_cores(), busy_cores()
    threads = auto_threads(cores, busy)
    if threads == cores:
        return threads, None
    return threads, (f"note: {busy:.1f} of {cores} cores are busy with other work: this run takes {threads} "
                     f"thread{'s' if threads > 1 else ''} (--threads 0 picks the free cores; --threads N sets N)")
