"""redrive's long-running parts in processes of their own, killed and restarted by the faults.

A part that exits without being signalled, or does not stop cleanly (exit 0) within its grace
after SIGTERM, is a crash: the faults count those beside lost and duplicated records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
TERM_GRACE_S = 60.0


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(extra or {})}


class Part:
    """One component process; every start appends to the same log."""

    def __init__(self, name: str, command: Sequence[str], log: Path,
                 env: dict[str, str] | None = None, *, group_kill: bool = False,
                 ready_text: str | None = None,
                 ready: Callable[[Part], bool] | None = None) -> None:
        self.name = name
        # How to tell it is at work: a line it writes at each start, or a check of its effects.
        self.ready_text = ready_text
        self.ready = ready
        self.started_at = 0.0
        self.started_ms = 0
        self.command = list(command)
        self.log = log
        self.env = environment(env)
        # A Spark driver's JVM runs in the driver's process group: killed with it, as when a
        # driver's machine dies.
        self.group_kill = group_kill
        self.process: subprocess.Popen[bytes] | None = None
        self.crashes: list[str] = []
        self.starts = 0

    def start(self) -> Part:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=self.group_kill)
        self.starts += 1
        self.started_at = time.monotonic()
        self.started_ms = time.time_ns() // 1_000_000
        return self

    def is_ready(self) -> bool:
        if self.ready is not None:
            return self.ready(self)
        return self.ready_text is None or \
            self.log_text().count(self.ready_text) >= self.starts

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the part is at work, so that a signal meets it working, not starting."""
        deadline = self.started_at + timeout_s
        while time.monotonic() < deadline and self.alive and not self.is_ready():
            time.sleep(0.1)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Note a crash if the process ended while nobody signalled it."""
        if self.process is not None and self.process.poll() is not None:
            self.crashes.append(f"{self.name} exited by itself with code "
                                f"{self.process.returncode} (start {self.starts})")
            self.process = None

    def kill(self) -> None:
        self.check()
        if self.process is None:
            return
        if self.group_kill:
            os.killpg(self.process.pid, signal.SIGKILL)
        else:
            self.process.kill()
        self.process.wait(30)
        self.process = None

    def terminate(self, grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM, and a crash unless the part stops with exit code 0 within grace_s."""
        self.check()
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.crashes.append(f"{self.name} did not stop within {grace_s:.0f} s of SIGTERM")
            self.kill()
            return
        if code != 0:
            self.crashes.append(f"{self.name} exited with code {code} after SIGTERM")
        self.process = None

    def abandon(self) -> None:
        """Kill whatever still runs (the end of a fault that failed), counting nothing."""
        if self.process is not None and self.process.poll() is None:
            if self.group_kill:
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
            self.process.wait(30)
        self.process = None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""
