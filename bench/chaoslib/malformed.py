"""Records with random redrive headers on the main and the retry topic.

Each record gets a few of redrive's headers, each valid or not: numbers that are not numbers,
bytes that are not UTF-8, huge values, a header repeated with another value after it. What
redrive must do follows from the contract: a record whose headers cannot be read goes to the
dead-letter topic as `malformed`; one whose headers are in fact valid is handled. The expected
outcome of each record is computed with redrive's own reader (`headers.read_delivery`); the
handler never fails here, so any other outcome is redrive's doing. After them come plain records
on every partition: they must be handled too (the partitions kept flowing).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from chaoslib.count import AT_LEAST_ONCE, Outcome, waiting
from chaoslib.faults import Sizes
from chaoslib.runs import ConsumerRun, create_topic
from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.errors import MalformedHeader

PARTITIONS = 2
TAIL = 50  # plain records per partition after the random ones
NUMBERS = (h.ATTEMPT, h.DUE, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET, h.ORIGINAL_TIMESTAMP,
           h.FIRST_FAILURE)
TEXTS = (h.GROUP, h.TARGET, h.ORIGINAL_TOPIC, h.ERROR_TYPE, h.ERROR_MESSAGE, h.ERROR_TRACE,
         h.REASON)
BAD_NUMBERS = (b"", b"-", b"12x", b" 7 ", b"-5", b"1e3", b"0x1f", b"+3", b"\xd9\xa3",
               b"\xef\xbc\x91", b"3.0", b"NaN")


def valid(name: str, topic: str, group: str, rng: random.Random) -> bytes:
    """A value redrive itself could have written (never a due time ahead: that would hold the
    partition until then, as it must)."""
    if name == h.DUE:
        return str(now_ms() - rng.randrange(0, 10**9)).encode()
    if name in NUMBERS:
        return str(rng.choice([0, 1, 2, 3, rng.randrange(10**6), 10**18])).encode()
    if name == h.GROUP:
        return group.encode()
    if name in (h.TARGET, h.ORIGINAL_TOPIC):
        return topic.encode()
    if name == h.REASON:
        return rng.choice(h.REASONS).encode()
    return "ValueError: ünïcode ✓".encode()


def invalid(name: str, rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 12)) + b"\xff\xfe"  # not UTF-8
    if kind == 1:  # huge: far past 19 digits, or a long text
        return b"9" * rng.randrange(20, 5000) if name in NUMBERS else b"x" * 16_000
    if kind == 2:
        return rng.choice(BAD_NUMBERS) if name in NUMBERS else b""
    return b"\x00" * rng.randrange(1, 8)


def random_headers(topic: str, group: str, rng: random.Random) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for name in rng.sample(NUMBERS + TEXTS, rng.randrange(1, 5)):
        good = rng.random() < 0.5
        value = valid(name, topic, group, rng) if good else invalid(name, rng)
        if name == h.DUE and good is False and rng.random() < 0.2:
            value = str(now_ms() + 10**12).encode() + b"0" * 30  # a far future, unreadable
        out.append((name, value))
        if rng.random() < 0.15:  # repeated: the last value is the one that counts
            out.append((name, valid(name, topic, group, rng) if rng.random() < 0.5
                        else invalid(name, rng)))
    rng.shuffle(out)
    out.append(("trace-id", rng.randbytes(8)))
    return out


def outcome_of(headers: list[tuple[str, bytes]], group: str) -> str:
    """skip (another group's, as a readable redrive-group says, whatever else it holds), dead
    (unreadable: dead-lettered as malformed) or ok."""
    if h.readable_group(headers) not in (None, group):
        return "skip"
    try:
        h.read_delivery(headers)
    except MalformedHeader:
        return "dead"
    return "ok"


def malformed_headers(bootstrap: str, scratch: Path, sizes: Sizes, seed: int = 18) -> Outcome:
    records = sizes.records(10_000, 1_000)
    run = ConsumerRun(bootstrap, scratch, "malformed", 0, partitions=PARTITIONS, handler_ms=0,
                      worker_args=["--no-failures"], expected={}, produce=False)
    create_topic(bootstrap, run.retry_topic, PARTITIONS)
    rng = random.Random(seed)
    producer = kafka.producer(bootstrap, overrides={"message.max.bytes": 2_000_000})
    for number in range(records + TAIL * PARTITIONS * 2):
        # Alternately on the main and the retry topic; the plain tail after the random ones.
        headers = random_headers(run.topic, run.group, rng) if number < records else []
        run.expected[number] = outcome_of(headers, run.group)
        topic = run.topic if number % 2 == 0 else run.retry_topic
        kafka.produce(producer, kafka.OutRecord(topic, str(number).encode(), None, headers,
                                                (number // 2) % PARTITIONS))
    if producer.flush(120):
        raise RuntimeError("malformed records not acknowledged in 120 s")
    try:
        run.worker("a").start()
        done = run.wait_finished(run.dead, sizes.finish_s)
        run.stop_all()
        outcome = run.outcome("random redrive headers (main + retry topic)", AT_LEAST_ONCE)
        if not done:
            outcome.notes.append(run.unfinished_note(sizes.finish_s))
        wrong = [r.number for r in run.dead_letters() if r.header(h.REASON) != "malformed"]
        if wrong:
            outcome.notes.append(f"dead letters not marked malformed: {wrong[:10]}")
        in_flight = {r.number for r in waiting(bootstrap, run.group,
                                               [run.topic, run.retry_topic])}
        kinds = Counter(run.expected.values())
        outcome.notes.append(f"of {records} random header sets {kinds['dead']} unreadable, "
                             f"{kinds['skip']} another group's; then "
                             f"{len(run.expected) - records} plain records")
        outcome.tally(run.expected, run.successes(), run.dead(), in_flight=in_flight)
        outcome.misrouted += len(wrong)
        return outcome
    finally:
        run.abandon()
