"""Free loopback ports for the development servers (brokers, PostgreSQL, Spark, metrics)."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    """A port on the loopback address that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


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
