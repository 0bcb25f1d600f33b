"""A development server's life tied to the process that started it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

# After a server has gone, how long the rest of its process group (a wrapper's broker, the
# JVM's Python workers) gets to follow before SIGKILL.
LEFTOVER_GRACE_S = 5.0


def tied_to_parent(command: Sequence[str],
                   on_death: signal.Signals = signal.SIGTERM) -> list[str]:
    """`command` run so that the kernel sends it `on_death` when its parent dies, even by
    SIGKILL, which atexit handlers cannot cover. setpriv execs the command, so the server keeps
    the pid it was started with (as do Spark's launcher scripts, so the setting reaches the JVM)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    prefix = [setpriv, "--pdeathsig", on_death.name, "--"] if setpriv else []
    return [*prefix, *command]


def signal_group(group: int, signum: signal.Signals) -> None:
    """`signum` to every process of `group`; one already gone (or never ours) is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def end_group(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM the process group `process` leads, then SIGKILL it when the process has not
    exited after `grace_s` or the rest of the group has not followed it within
    LEFTOVER_GRACE_S. A process reaped already (a crash seen earlier) is left alone: its pid,
    the group's id, may be another server's group by now."""
    if process.returncode is not None:
        return
    group = process.pid
    signal_group(group, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        signal_group(group, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_group(group, signal.SIGKILL)
