"""The on-call tools' reads of a dead-letter topic (the console's pages, `redrive dlt ls`) run
with the garbage collector held off (a quarter to a third of a read of 100,000 dead letters went
to collections that found nothing), and give it back as they end, on an error too."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from redrive.cli import cli
from redrive.cli import ops as cli_ops
from redrive.ops import console as console_module
from redrive.ops.console import Console, Selection


class Stop(Exception):
    pass


def reader_noting_the_collector(seen: list[bool]) -> type:
    """A Reader that notes whether the collector runs as it is made, then stops the read."""

    class Reader:
        def __init__(self, *args: Any) -> None:
            seen.append(gc.isenabled())
            raise Stop

    return Reader


@pytest.mark.parametrize("read", [
    lambda console: console.view("x.g.dlt", Selection()),
    lambda console: console.letters("x.g.dlt", Selection()),
], ids=["view", "letters"])
def test_the_collector_is_off_while_the_console_reads_and_on_after(
        monkeypatch: pytest.MonkeyPatch, read: Callable[[Console], Any]) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(console_module, "Reader", reader_noting_the_collector(seen))
    assert gc.isenabled()
    with pytest.raises(Stop):
        read(Console("127.0.0.1:1", token=None))
    assert seen == [False] and gc.isenabled()


def test_the_collector_is_off_while_dlt_ls_reads_and_on_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    monkeypatch.setattr(cli_ops, "Reader", reader_noting_the_collector(seen))
    result = CliRunner().invoke(cli, ["dlt", "ls", "-b", "127.0.0.1:1", "--dlt-topic", "x.g.dlt"])
    assert isinstance(result.exception, Stop)
    assert seen == [False] and gc.isenabled()
