"""One consumer workload on a broker: its topic, its workers, its sink, its progress."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from chaoslib import workload
from chaoslib.count import Outcome, Read, read_topic, sink_successes
from chaoslib.procs import Part, python
from redrive import kafka

POLL_S = 0.5


def unique(prefix: str) -> str:
    return f"chaos-{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = kafka.admin(bootstrap)
    kafka.create_topics(admin, {topic: partitions})
    deadline = time.monotonic() + 30
    while kafka.topic_partitions(admin).get(topic) != partitions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} not created in 30 s")
        time.sleep(0.05)


def expected_of(records: int) -> dict[int, str]:
    return {n: "dead" if workload.always_fails(n) else "ok" for n in range(records)}


class ConsumerRun:
    """N numbered records in a new topic and the workers that handle them (as processes)."""

    def __init__(self, bootstrap: str, scratch: Path, name: str, records: int, *,
                 partitions: int = 4, handler_ms: float = 0.5, worker_args: Sequence[str] = (),
                 expected: dict[int, str] | None = None, produce: bool = True) -> None:
        self.bootstrap = bootstrap
        self.name = name
        self.topic, self.group = unique(name), unique(f"{name}-g")
        self.log = scratch / f"{name}.sink"
        self.scratch = scratch
        self.expected = expected if expected is not None else expected_of(records)
        self.handler_ms = handler_ms
        self.worker_args = list(worker_args)
        self.parts: list[Part] = []
        self.started = time.monotonic()
        create_topic(bootstrap, self.topic, partitions)
        if produce:
            self.produce(range(records))

    def produce(self, numbers: range) -> None:
        producer = kafka.producer(self.bootstrap)
        for number in numbers:
            value = str(number).encode()
            kafka.produce(producer, kafka.OutRecord(self.topic, value, value))
        if producer.flush(60):
            raise RuntimeError(f"{self.name}: records not acknowledged in 60 s")

    def wait_members(self, pids: list[int], timeout_s: float = 60.0) -> None:
        """Until each of these worker processes has handled a record (the group is settled)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = {int(line.split()[6]) for line in self.sink_lines()}
            if set(pids) <= seen:
                return
            time.sleep(0.05)

    def warm_up(self, pids: list[int], first: int, timeout_s: float = 60.0) -> None:
        """Until each of these workers has handled a record, producing a few warm-up numbers
        (from `first`, all ending in 0: none fails) every POLL_S: a member that joins once the
        earlier warm-up numbers are all handled has nothing to handle otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = {int(line.split()[6]) for line in self.sink_lines()}
            if set(pids) <= seen:
                return
            self.produce(range(first, first + 10 * 20, 10))
            first += 10 * 20
            time.sleep(POLL_S)
        raise RuntimeError(f"{self.name}: workers {pids} not all handling in {timeout_s} s")

    def sink_lines(self) -> list[str]:
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text().splitlines() if len(line.split()) == 8]

    @property
    def dlt(self) -> str:
        return f"{self.topic}.{self.group}.dlt"

    @property
    def retry_topic(self) -> str:
        return f"{self.topic}.{self.group}.retry.{workload.DELAY}"

    def worker(self, instance: str, *extra: str) -> Part:
        command = python("-m", "chaoslib.worker", "--bootstrap", self.bootstrap,
                         "--topic", self.topic, "--group", self.group, "--log", str(self.log),
                         "--instance", instance, "--handler-ms", str(self.handler_ms),
                         *self.worker_args, *extra)
        return self.add(Part(f"worker {instance}", command,
                             self.scratch / f"{self.name}.{instance}.out", ready_text="started"))

    def add(self, part: Part) -> Part:
        self.parts.append(part)
        return part

    def successes(self) -> Counter[int]:
        """The counted numbers' successes (a warm-up's are left out)."""
        return Counter({n: k for n, k in sink_successes(self.log).items() if n in self.expected})

    def dead_letters(self) -> list[Read]:
        return read_topic(self.bootstrap, self.dlt)

    def dead(self) -> Counter[int]:
        return Counter(r.number for r in self.dead_letters())

    def progress(self) -> float:
        wanted = sum(1 for kind in self.expected.values() if kind == "ok")
        return len(self.successes()) / max(1, wanted)

    def wait_progress(self, fraction: float, timeout_s: float = 120.0) -> None:
        """Until that share of the successes is in the sink (or a part crashed, or time ran
        out: the fault is injected then anyway, and the counts tell the rest)."""
        deadline = time.monotonic() + timeout_s
        while self.progress() < fraction and time.monotonic() < deadline:
            if not self.check_parts():
                return
            time.sleep(0.05)

    def check_parts(self) -> bool:
        for part in self.parts:
            if part.process is not None:
                part.check()
        return not any(part.crashes for part in self.parts)

    def wait_finished(self, dead: Callable[[], Counter[int]], timeout_s: float) -> bool:
        """Until every number succeeded or was dead-lettered."""
        deadline = time.monotonic() + timeout_s
        wanted = {n for n, kind in self.expected.items() if kind != "skip"}
        while time.monotonic() < deadline:
            self.check_parts()
            done = set(self.successes())
            if wanted - done <= set(dead()):
                return True
            if not any(part.alive for part in self.parts):
                return False  # every part crashed: nothing more will come
            time.sleep(POLL_S * 4)
        return False

    def unfinished_note(self, timeout_s: float) -> str:
        if any(part.crashes for part in self.parts):
            return "not finished: a part crashed"
        return f"not finished within {timeout_s:.0f} s"

    def stop_all(self) -> None:
        for part in self.parts:
            part.wait_ready(timeout_s=10.0)
            part.terminate()

    def abandon(self) -> None:
        for part in self.parts:
            part.abandon()

    def outcome(self, fault: str, mode: str) -> Outcome:
        outcome = Outcome(fault, mode)
        outcome.crashes = sum(len(part.crashes) for part in self.parts)
        outcome.notes += [crash for part in self.parts for crash in part.crashes]
        outcome.seconds = time.monotonic() - self.started
        return outcome
