"""A command under a pseudo-terminal whose other end closes: how a terminal window or an ssh session dies.

The child is a session leader with the pseudo-terminal as its controlling terminal (as a shell's
foreground job is); closing our end makes the kernel send it SIGHUP, and every later write to the
terminal fails with EIO. Pipes, which the other tests use, cannot show either.
"""

from __future__ import annotations

import os
import pty
import select
import time


class Terminal:
    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike | None = None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once (nothing of pytest's state is used)
            if cwd is not None:
                os.chdir(cwd)
            os.execve(argv[0], argv, env)
        self.text = ""

    def read_until(self, done, timeout: float) -> bool:
        """Read what the child prints until `done(text so far)` or `timeout` seconds; whether `done` held."""
        deadline = time.monotonic() + timeout
        while not done(self.text):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.text += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal (it ended)
                    return done(self.text)
        return True

    def hang_up(self, timeout: float) -> int | None:
        """Close our end (the kernel sends the child SIGHUP), then its exit status (None: still running
        after `timeout` seconds; it is then killed)."""
        os.close(self.fd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        return None
