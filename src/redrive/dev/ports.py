"""Free loopback ports for the development servers (brokers, PostgreSQL, Spark, metrics)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ephemeral range, so that no outgoing connection can take the port.
LOWEST = 10_000
TRIES = 500
PROC = Path("/proc")
# A socket's state in /proc/net/tcp: TCP_LISTEN.
LISTEN = "0A"

# A port handed out is not handed out again in this process, even if its server has not bound
# it yet: the Spark cluster asks for four ports before any of its servers starts.
_handed_out: set[int] = set()


def free_port() -> int:
    """A port on the loopback address that nothing listens on right now.

    The kernel's own choice (binding port 0) comes from the ephemeral range, which every
    outgoing connection draws from too, Kafka clients' included: between the choice and the
    server's bind, a client's connection could take the port, and the server would fail or
    move to another port (Spark does) where the test does not look for it. Ports are chosen
    below that range where the machine allows it.
    """
    low, high = LOWEST, ephemeral_low(EPHEMERAL_RANGE_FILE) - 1
    if high - low < 1_000:
        return _kernel_choice()
    for _ in range(TRIES):
        port = random.randint(low, high)
        if port not in _handed_out and port_in_use(port) is None:
            _handed_out.add(port)
            return port
    return _kernel_choice()


def ephemeral_low(range_file: Path) -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _kernel_choice() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port = int(probe.getsockname()[1])
    _handed_out.add(port)
    return port


def port_in_use(port: int) -> OSError | None:
    """Why `port` cannot be bound on the loopback address, or None when a server could bind it.

    Only a listener counts, not connections of a stopped server left in TIME_WAIT.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return exc
    return None


def held_by(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a TCP socket listening on `port`: something that accepts on
    the port may be another process's server. None where /proc cannot tell (not Linux, or a
    process of another user)."""
    listeners: set[str] = set()
    tables = 0
    for table in ("tcp", "tcp6"):
        try:
            rows = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            fields = row.split()
            if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                listeners.add(f"socket:[{fields[9]}]")
    if not tables:
        return None
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except FileNotFoundError:
        return False
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) in listeners:
                return True
    return False
