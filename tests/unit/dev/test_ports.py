"""Ports for the development servers are chosen where no outgoing connection can take them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from redrive.dev import ports


def test_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low = ports.ephemeral_low(ports.EPHEMERAL_RANGE_FILE)
    chosen = [ports.free_port() for _ in range(200)]
    assert len(set(chosen)) == 200
    assert all(ports.LOWEST <= port < low for port in chosen)


def test_a_port_with_a_listener_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    spare = ports._kernel_choice()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((ports.HOST, 0))
        listener.listen()
        taken = listener.getsockname()[1]
        draws = iter([taken, taken, spare])
        monkeypatch.setattr(ports.random, "randint", lambda low, high: next(draws))
        monkeypatch.setattr(ports, "ephemeral_low", lambda path: 65_000)
        monkeypatch.setattr(ports, "LOWEST", 1_024)
        monkeypatch.setattr(ports, "_handed_out", set())
        assert ports.free_port() == spare


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    custom = tmp_path / "range"
    custom.write_text("40000\t60999\n")
    assert ports.ephemeral_low(custom) == 40_000
    assert ports.ephemeral_low(tmp_path / "missing") == 32_768
    (tmp_path / "bad").write_text("")
    assert ports.ephemeral_low(tmp_path / "bad") == 32_768


def test_the_kernel_chooses_when_no_room_is_left_below_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = ports.ephemeral_low(ports.EPHEMERAL_RANGE_FILE)
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setattr(ports, "ephemeral_low", lambda path: ports.LOWEST + 999)
    monkeypatch.setattr(ports.random, "randint", lambda low, high: pytest.fail("drew a port"))
    narrow = ports.free_port()
    assert narrow >= kernels
    assert narrow in ports._handed_out


def test_the_kernel_chooses_when_every_draw_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = ports.ephemeral_low(ports.EPHEMERAL_RANGE_FILE)
    taken = ports._kernel_choice()
    monkeypatch.setattr(ports, "_handed_out", {taken})
    monkeypatch.setattr(ports, "ephemeral_low", lambda path: 40_000)
    draws: list[int] = []
    monkeypatch.setattr(ports.random, "randint", lambda low, high: draws.append(taken) or taken)
    chosen = ports.free_port()
    assert len(draws) == ports.TRIES
    assert chosen != taken and chosen >= kernels
