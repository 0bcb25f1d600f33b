"""A development server's life tied to the process that started it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Sequence


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
