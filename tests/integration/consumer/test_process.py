"""The consumer as a process: SIGTERM stops it cleanly; SIGKILL loses nothing (noida-db).

The crash tests give the worker a group.instance.id: noida-db never expires a member killed
without leaving, but hands a restarted static member its partitions back at once (see
brokers.md); that is also how such workers run on Kubernetes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from redrive import headers as h

from .conftest import Read, committed, produce, read_all, topic_size, wait_until

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
WORKER = Path(__file__).with_name("worker.py")


class Broker(Protocol):
    """The session's broker fixture: its address and kind ("noida-db", or "external")."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class Call:
    number: int
    attempt: int
    topic: str
    partition: int
    offset: int
    ok: bool
    at_ms: int
    due_ms: int


def calls(log: Path) -> list[Call]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) != 8:
            continue  # a line cut by SIGKILL
        number, attempt, topic, partition, offset, outcome, at_ms, due_ms = parts
        out.append(Call(int(number), int(attempt), topic, int(partition), int(offset),
                        outcome == "ok", int(at_ms), int(due_ms)))
    return out


class Workers:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        output = (self.tmp_path / f"worker-{len(self.processes)}.out").open("wb")
        process = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=output,
                                   stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def output(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.out").read_text()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path)
    yield started
    for process in started.processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_finishes_the_record_in_hand_and_commits_what_finished(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, workers: Workers,
        tmp_path: Path) -> None:
    topic, group, log = new_topic(partitions=2), unique_name("term"), tmp_path / "calls.log"
    for partition in (0, 1):
        produce(bootstrap, topic, [str(n).encode() for n in range(partition, 300, 2)],
                partition=partition)
    worker = workers.start("--bootstrap", bootstrap, "--topic", topic, "--group", group,
                           "--log", str(log), "--handler-ms", "10", "--batch-size", "50")
    wait_until(lambda: len(calls(log)) >= 40, 30, "40 records handled")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, workers.output(0)
    assert "stopped" in workers.output(0)

    handled = calls(log)
    assert 40 <= len(handled) < 300  # it stopped mid-stream
    offsets = committed(bootstrap, group, topic)
    for partition in (0, 1):
        done = sorted(c.offset for c in handled if c.partition == partition)
        assert done == list(range(len(done)))  # each once, in order
        expected = len(done) if done else -1001
        assert offsets[partition] == expected, (partition, offsets, len(done))


@dataclass(frozen=True)
class Unfinished:
    """Where the numbers that never finished stand once the wait ran out."""

    numbers: list[int]
    # number -> its copy that no call handled, behind an aborted transaction in its partition
    passed_over: dict[int, Read]
    report: str


def unfinished(bootstrap: str, topic: str, group: str, log: Path, workers: Workers,
               alive: set[int], dead: set[int]) -> Unfinished:
    """Each unfinished number's calls, its copies as read_committed and read_uncommitted
    consumers see them, the group's offsets and the workers' last lines; and which numbers have
    a committed copy that no call handled behind an aborted transaction's record in the same
    partition (passed over: noida-db hides a producer's records past its abort from a
    read_committed fetch begun past it; docs/benchmarks.md). Both views are read from the start
    (noida-db answers with a partition's whole backlog), so neither begins past an abort. A
    record a read_committed consumer does not get below one it gets is an aborted one: an open
    transaction would hold both back."""
    seen = calls(log)
    numbers = sorted((alive - {c.number for c in seen if c.ok})
                     | (dead - {c.number for c in seen if not c.ok and c.attempt == 2}))
    retry_topic = f"{topic}.{group}.retry.700ms"
    lines = [f"unfinished numbers: {numbers}"]
    for number in numbers:
        lines.append(f"  {number} calls: " + ", ".join(
            f"attempt {c.attempt} {c.topic}[{c.partition}]@{c.offset} {'ok' if c.ok else 'fail'}"
            for c in seen if c.number == number))
    views = {isolation: read_all(bootstrap, retry_topic, idle_s=1.0, isolation=isolation)
             for isolation in ("read_committed", "read_uncommitted")}
    for isolation, copies in views.items():
        lines.append(f"  {retry_topic} as {isolation}: {len(copies)} records; of the unfinished: "
                     + ", ".join(f"{c.value!r} [{c.partition}]@{c.offset} "
                                 f"attempt {c.header(h.ATTEMPT)}"
                                 for c in copies if int(c.value or b"-1") in numbers))
    offsets = {name: committed(bootstrap, group, name) for name in (topic, retry_topic)}
    lines.extend(f"  committed {name}: {at}" for name, at in offsets.items())
    handled = {(c.partition, c.offset) for c in seen if c.topic == retry_topic}
    kept = {(c.partition, c.offset) for c in views["read_committed"]}
    first_abort: dict[int, int] = {}
    for c in views["read_uncommitted"]:
        if (c.partition, c.offset) not in kept:
            first_abort[c.partition] = min(first_abort.get(c.partition, c.offset), c.offset)
    passed_over = {int(c.value or b"-1"): c for c in views["read_committed"]
                   if int(c.value or b"-1") in numbers and (c.partition, c.offset) not in handled
                   and first_abort.get(c.partition, c.offset) < c.offset}
    for index in range(len(workers.processes)):
        tail = workers.output(index).splitlines()[-25:]
        lines.append(f"  worker {index} output (last {len(tail)} lines):")
        lines.extend(f"    {line}" for line in tail)
    return Unfinished(numbers, passed_over, "\n".join(lines))


def run_crash(bootstrap: str, topic: str, group: str, log: Path, workers: Workers,
              *extra: str, on_noida_db: bool = False) -> tuple[list[Call], list[str]]:
    """Start a static member, SIGKILL it while records wait in retry topics, restart it, and
    return the calls once every number succeeded or was dead-lettered, and the DLT's values."""
    total = 120
    transactional = "--transactional" in extra
    for partition in (0, 1):
        produce(bootstrap, topic, [str(n).encode() for n in range(partition, total, 2)],
                partition=partition)
    args = ("--bootstrap", bootstrap, "--topic", topic, "--group", group, "--log", str(log),
            "--instance", "worker-1", "--fail-every", "4", "--dead-every", "10",
            "--delay", "700ms", "--attempts", "3", "--handler-ms", "5", "--batch-size", "20",
            *extra)
    first = workers.start(*args)
    retry_topic = f"{topic}.{group}.retry.700ms"
    wait_until(lambda: topic_size(bootstrap, retry_topic) >= 4, 30, "4 copies in the retry topic")
    first.kill()
    first.wait()
    succeeded_before = {c.number for c in calls(log) if c.ok}
    waiting = [copy for copy in read_all(bootstrap, retry_topic, idle_s=0.3)
               if int(copy.value or b"-1") not in succeeded_before]
    assert waiting, "the worker was killed with no record waiting in a retry topic"

    second = workers.start(*args)
    dead = {n for n in range(total) if n % 10 == 0}
    alive = set(range(total)) - dead

    def finished() -> bool:
        seen = calls(log)
        succeeded = {c.number for c in seen if c.ok}
        exhausted = {c.number for c in seen if not c.ok and c.attempt == 2}
        return alive <= succeeded and dead <= exhausted

    try:
        wait_until(finished, 60, "every record succeeded or exhausted")
    except AssertionError as timeout:
        left = unfinished(bootstrap, topic, group, log, workers, alive, dead)
        if transactional and on_noida_db and set(left.passed_over) == set(left.numbers):
            pytest.xfail(
                "noida-db deviation: once a transaction is aborted (here the killed worker's, "
                "by the takeover of its transactional id), a read_committed fetch begun past it "
                "gets none of the same producer's later records, which a read_committed "
                "consumer reading from before the abort gets (bench/aborts.py shows it with "
                "confluent-kafka alone). The copies of "
                + ", ".join(f"{n} ([{c.partition}]@{c.offset})"
                            for n, c in sorted(left.passed_over.items()))
                + " are committed behind an aborted transaction in their partitions, and "
                "were never handled.\n"
                + left.report)
        raise AssertionError(f"{timeout}\n{left.report}") from timeout
    letters = read_all(bootstrap, f"{topic}.{group}.dlt", expect=len(dead), timeout_s=20)
    second.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0, workers.output(1)

    seen = calls(log)
    assert {c.number for c in seen if c.ok} == alive  # none lost, none of the dead succeeded
    assert {int(letter.value or b"-1") for letter in letters} == dead
    assert all(c.at_ms >= c.due_ms for c in seen if c.due_ms >= 0), "handled before due"
    for letter in letters:
        assert letter.header(h.REASON) == "exhausted"
    return seen, [letter.value.decode() for letter in letters if letter.value is not None]


def test_sigkill_while_records_wait_in_retry_loses_nothing(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, workers: Workers,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group, log = new_topic(partitions=2), unique_name("crash"), tmp_path / "calls.log"
    seen, letters = run_crash(bootstrap, topic, group, log, workers)
    handled = Counter((c.number, c.attempt) for c in seen)
    duplicates = sum(count - 1 for count in handled.values())
    dead_duplicates = len(letters) - len(set(letters))
    with capsys.disabled():
        print(f"\n  at-least-once crash: {len(seen)} handler calls, {duplicates} repeated "
              f"deliveries, {dead_duplicates} duplicate dead letters")


def test_sigkill_in_transactional_mode_duplicates_no_copy(
        broker: Broker, new_topic: NewTopic, unique_name: UniqueName, workers: Workers,
        tmp_path: Path) -> None:
    topic, group, log = new_topic(partitions=2), unique_name("eos"), tmp_path / "calls.log"
    bootstrap = broker.bootstrap
    seen, letters = run_crash(bootstrap, topic, group, log, workers, "--transactional",
                              on_noida_db=broker.kind == "noida-db")
    assert sorted(letters) == sorted(set(letters))
    copies = read_all(bootstrap, f"{topic}.{group}.retry.700ms", timeout_s=20)
    keys = Counter((c.header(h.ORIGINAL_PARTITION), c.header(h.ORIGINAL_OFFSET),
                    c.header(h.ATTEMPT)) for c in copies)
    assert keys and max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    # Every failure that was not the last attempt has exactly one copy in the retry topic.
    retried = {n for n in range(120) if n % 4 == 0 or n % 10 == 0}
    assert {int(c.value or b"-1") for c in copies} == retried
    assert sum(1 for c in seen if c.attempt >= 1) >= len(retried)
