"""One grading process per Python process, for GEM's math envs stepped from threads (`use_mp`).

GEM's `MathEnv` grades with a 1-second timeout. In-process that timeout is a SIGALRM, which only the
main thread may set; Oat calls an actor's `step` from a courier thread, so there the env must grade in
another process (`use_mp=True`). GEM's own `use_mp` forks a `multiprocessing.Pool(1)` per env: with 16
envs in a vLLM actor that is 16 forks of the actor, and when the actor is stopped, `Pool`'s maintenance
thread replaces the killed workers just before the actor dies, leaving them orphaned (found after a
stopped `bench peers` run: 30 such processes). `shared_grader()` is what the envs use instead: one
forked worker for every env of the process (GEM's env calls `apply_async(fn, args).get(timeout=1)`,
which it keeps), which

* ends with the process that made it (it watches its parent: a SIGKILL of the actor leaves no grader);
* is replaced after a grading that timed out (the stuck worker would otherwise make every later
  grading of every env time out too).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import threading
import time
from typing import Any, Callable


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)  # the parent ended: this process was handed to another


def _end_with_parent(parent: int) -> None:
    """Pool initializer: end this worker when the process that forked it ends. (Not Linux's parent-death
    signal: that fires when the forking *thread* ends, and a worker killed while it waits for a task takes
    the pool's queue lock with it.)"""
    if os.getppid() != parent:  # the parent ended before this ran
        os._exit(0)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="grader-watch").start()


class _Pending:
    """GEM's handle on one grading: `get(timeout)` as `AsyncResult.get`; a timeout replaces the worker."""

    def __init__(self, grader: "SharedGrader", pool: multiprocessing.pool.Pool,
                 result: multiprocessing.pool.AsyncResult) -> None:
        self.grader, self.pool, self.result = grader, pool, result

    def get(self, timeout: float | None = None) -> Any:
        try:
            return self.result.get(timeout)
        except multiprocessing.TimeoutError:
            self.grader.restart(self.pool)  # the worker it waited on, not one a later grading started
            raise


class SharedGrader:
    """`apply_async(fn, args)` in one lazily forked worker process (thread-safe), shared by the envs that
    hold a `handle()`; the worker ends when the last handle is closed (or with this process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: multiprocessing.pool.Pool | None = None
        self._users = 0

    def handle(self) -> "GraderHandle":
        with self._lock:
            self._users += 1
        return GraderHandle(self)

    def apply_async(self, fn: Callable[..., Any], args: tuple = ()) -> _Pending:
        with self._lock:
            if self._pool is None:
                self._pool = multiprocessing.get_context("fork").Pool(
                    1, initializer=_end_with_parent, initargs=(os.getpid(),))
            return _Pending(self, self._pool, self._pool.apply_async(fn, args))

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._pool._pool] if self._pool is not None else []  # type: ignore[attr-defined]

    def restart(self, pool: multiprocessing.pool.Pool | None = None) -> None:
        """End the worker (a new one starts with the next grading); given `pool`, only if it is still the one in
        use (a grading that timed out on a worker already replaced leaves the new one alone)."""
        with self._lock:
            if pool is not None and pool is not self._pool:
                return
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.restart()


class GraderHandle:
    """One env's `mp_pool`: GEM calls `apply_async`, and `close()` (the adapter also `terminate()`) when
    the env closes; either releases this env's share once."""

    def __init__(self, grader: SharedGrader) -> None:
        self.grader, self._open = grader, True

    def apply_async(self, fn: Callable[..., Any], args: tuple = ()) -> _Pending:
        return self.grader.apply_async(fn, args)

    def close(self) -> None:
        if self._open:
            self._open = False
            self.grader._release()

    terminate = close


_GRADERS: dict[int, SharedGrader] = {}  # by process id: a forked child makes its own


def shared_grader() -> GraderHandle:
    """A handle on this process's grader (made on first use, in the process that uses it)."""
    return _GRADERS.setdefault(os.getpid(), SharedGrader()).handle()
