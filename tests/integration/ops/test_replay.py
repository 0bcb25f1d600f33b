"""Replay on noida-db: to the first retry topic and to the original topic, then processed by the
consumer runtime; a second replay publishes nothing; the audit log holds who, when and what."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType
from fastapi.testclient import TestClient

from redrive import headers as h
from redrive import kafka, topics
from redrive.consumer import RetryingConsumer
from redrive.metrics import Metrics
from redrive.ops import deadletters
from redrive.ops.deadletters import make_filter
from redrive.ops.replay import LOG_CONFIG, REPLAY_LOG, TO_ORIGINAL, ReplayFailed, read_log, replay
from redrive.ops.web import create_app
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record

from ..consumer.conftest import FAST_GROUP, Handled, Running, read_all, wait_until
from .conftest import produce_records, run_cli, topic_sizes

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]


class Outage(Exception):
    pass


class Fixable:
    """A handler that fails chosen values until the 'bug' is fixed."""

    def __init__(self, failing: set[bytes]) -> None:
        self.failing = failing
        self.fixed = threading.Event()
        self.seen = Handled()

    def __call__(self, record: Record) -> None:
        self.seen.add(record)
        if record.value in self.failing and not self.fixed.is_set():
            raise Outage(f"{record.value!r} failed")


def test_replay_to_the_first_retry_topic_is_processed_once(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(partitions=2), unique_name("replay")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=2)
    handler = Fixable({b"flaky-1", b"flaky-2"})
    produce_records(bootstrap, topic, [(b"a", b"ok", []), (b"b", b"flaky-1", [])], partition=0)
    produce_records(bootstrap, topic, [(b"c", b"flaky-2", [])], partition=1)
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 2, 30, "2 dead letters")
    retry_topic, dlt = f"{topic}.{group}.retry.100ms", f"{topic}.{group}.dlt"
    before = topic_sizes(bootstrap, retry_topic, dlt, topic)
    assert before == {retry_topic: 2, dlt: 2, topic: 3}

    handler.fixed.set()
    base = ["dlt", "replay", "-b", bootstrap, "--topic", topic, "--group", group,
            "--actor", "oncall@test"]
    dry = run_cli(*base, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would replay 2 of 2" in dry.stdout and retry_topic in dry.stdout
    assert topic_sizes(bootstrap, retry_topic, dlt, topic) == before
    assert read_log(bootstrap, dlt) == {}

    first = run_cli(*base, "--key", "b")
    assert first.exit_code == 0, first.output
    assert "replayed 1 of 1 selected" in first.stdout
    wait_until(lambda: handler.seen.count(b"flaky-1") == 3, 20, "the replayed copy handled")
    copy = handler.seen.calls[-1][0]
    assert copy.topic == retry_topic and copy.partition == 0
    assert copy.delivery.attempt == 0 and copy.delivery.group == group
    assert copy.delivery.original is not None and copy.delivery.original.offset == 1

    second = run_cli(*base)
    assert second.exit_code == 0, second.output
    assert "replayed 1 of 2 selected" in second.stdout and "1 already replayed" in second.stdout
    wait_until(lambda: handler.seen.count(b"flaky-2") == 3, 20, "the second copy handled")
    again = run_cli(*base)
    assert "replayed 0 of 2 selected" in again.stdout and "2 already replayed" in again.stdout
    wait_until(lambda: run.total("redrive_processed_total") == 3, 20, "3 processed")
    run.stop()

    # Exactly one copy per dead letter, however often the replay ran; nothing dead again. (End
    # offsets also count the replay transactions' commit markers, so records are counted.)
    copies = [r for r in read_all(bootstrap, retry_topic, expect=4) if r.header(h.REASON) is None
              and r.header(h.ATTEMPT) is None]
    assert sorted(r.value or b"" for r in copies) == [b"flaky-1", b"flaky-2"]
    assert topic_sizes(bootstrap, dlt, topic) == {dlt: 2, topic: 3}
    assert [handler.seen.count(v) for v in (b"ok", b"flaky-1", b"flaky-2")] == [1, 3, 3]
    assert run.total("redrive_dead_lettered_total") == 2

    log = read_log(bootstrap, dlt)
    assert len(log) == 2
    letters = {d.value: d for d in read_all(bootstrap, dlt, expect=2)}
    entry = log[f"{dlt}/{letters[b'flaky-1'].partition}/{letters[b'flaky-1'].offset}"]
    assert entry["who"] == "oncall@test" and entry["to"] == "retry"
    assert entry["attempts"] == "reset" and entry["reason"] == "exhausted"
    assert entry["destination"]["topic"] == retry_topic
    source = entry["source"]
    assert source.pop("timestamp_ms") > 0  # the record's, telling it from a former one there
    assert source == {"topic": dlt, "partition": letters[b"flaky-1"].partition,
                      "offset": letters[b"flaky-1"].offset}
    assert entry["when_ms"] > 0 and entry["when"].endswith("+00:00")


def test_replay_to_the_original_topic_keeps_attempts_and_skips_what_it_cannot(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, running: Start) -> None:
    topic, group = new_topic(), unique_name("orig")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=3)
    handler = Fixable({b"x1", b"x2", b"x3"})
    produce_records(bootstrap, topic, [(f"k{i}".encode(), f"x{i}".encode(), [])
                                       for i in (1, 2, 3)])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, handler, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 3, 30, "3 dead letters")
    dlt = f"{topic}.{group}.dlt"
    # A hand-made record in the same dead-letter topic with unreadable redrive headers.
    produce_records(bootstrap, dlt, [(b"k9", b"x9", [(h.REASON, b"exhausted"),
                                                     (h.ATTEMPT, b"many")])])
    handler.fixed.set()
    metrics = Metrics("replay", group)
    progress: list[tuple[int, int]] = []
    collecting: list[bool] = []  # whether the garbage collector ran, at each progress call

    def advanced(n: int, total: int) -> None:
        progress.append((n, total))
        collecting.append(gc.isenabled())

    report = replay(bootstrap, dlt, to=TO_ORIGINAL, keep_attempts=True, rate="20/s",
                    selection=make_filter(keys=["k1", "k2", "k9"]), actor="api@test",
                    metrics=metrics, progress=advanced)
    assert collecting and not any(collecting) and gc.isenabled()
    assert report.selected == 3 and len(report.replayed) == 2 and not report.already
    assert [s.why.split(":")[0] for s in report.skipped] == ["unreadable headers"]
    checked = run_cli("dlt", "replay", "-b", bootstrap, "--dlt-topic", dlt, "--to", "original",
                      "--key", "k9", "--dry-run")
    assert checked.exit_code == 1, checked.output  # a script learns that one was skipped
    assert "would replay 0 of 1 selected record(s)" in checked.output
    assert "1 skipped" in checked.output
    assert sum(n for n, _ in progress) == 3 and {total for _, total in progress} == {3}
    assert metrics.value("redrive_replayed_total", topic=topic) == 2
    assert {r.destination[0] for r in report.replayed} == {topic}

    wait_until(lambda: run.total("redrive_processed_total") == 2, 20, "2 replays processed")
    run.stop()
    copies = [record for record, _ in handler.seen.calls
              if record.topic == topic and record.offset >= 3]
    assert sorted(r.value or b"" for r in copies) == [b"x1", b"x2"]
    for record in copies:
        assert record.delivery.attempt == 3 and record.delivery.group == group
        assert record.delivery.first_failure_ms is not None
    assert handler.seen.count(b"x3") == 3  # not selected: still dead

    again = replay(bootstrap, dlt, to=TO_ORIGINAL, keep_attempts=True,
                   selection=make_filter(keys=["k1", "k2"]))
    assert (len(again.replayed), len(again.already)) == (0, 2)
    assert len(read_all(bootstrap, topic, expect=5)) == 5
    entries = read_log(bootstrap, dlt)
    assert {e["attempts"] for e in entries.values()} == {"kept"}
    assert {e["who"] for e in entries.values()} == {"api@test"}
    resource = ConfigResource(ResourceType.TOPIC, REPLAY_LOG)
    admin = kafka.admin(bootstrap)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["cleanup.policy"].value == "compact"


def test_dry_run_replay_plans_the_first_retry_topic_of_an_exponential_policy(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("exp-replay")
    policy = RetryPolicy(backoff=Backoff.exponential("2s", 3, "10s"), attempts=4)
    plan = topics.plan(policy, topic, group)
    topics.ensure_topics(kafka.admin(bootstrap), plan)
    assert plan.dead_letter is not None
    produce_records(bootstrap, plan.dead_letter, [(b"k", b"v", [
        (h.REASON, b"exhausted"), (h.ATTEMPT, b"4"), (h.GROUP, group.encode()),
        (h.ORIGINAL_TOPIC, topic.encode()), (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"7")])])
    before = topic_sizes(bootstrap, *plan.created_topics)
    base = ["dlt", "replay", "-b", bootstrap, "--topic", topic, "--group", group, "--dry-run"]

    # On the cluster alone the first of the plan's three retry topics cannot be told apart.
    unplanned = run_cli(*base)
    assert unplanned.exit_code == 2
    assert "3 retry topics exist" in unplanned.stderr
    dry = run_cli(*base, "--exponential", "2s", "--multiplier", "3", "--max-delay", "10s",
                  "--attempts", "4")
    assert dry.exit_code == 0, dry.output
    first = plan.retry_topic_for(1).name
    assert first == f"{topic}.{group}.retry.2s"
    assert dry.stdout.splitlines()[2].split() == ["0:0", first]
    assert "would replay 1 of 1 selected" in dry.stdout
    assert topic_sizes(bootstrap, *plan.created_topics) == before


def test_a_log_entry_that_is_not_redrives_stops_the_replay_naming_it(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("bad-log")
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k", b"v", [
        (h.REASON, b"exhausted"), (h.ATTEMPT, b"2"), (h.GROUP, group.encode()),
        (h.ORIGINAL_TOPIC, topic.encode()), (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0")])])
    produce_records(bootstrap, REPLAY_LOG, [(f"{dlt}/0/0".encode(), b"not json {", []),
                                            (f"{dlt}/0/1".encode(), b'{"when_ms": "today"}', []),
                                            (f"{dlt}/0/2".encode(), b'{"history": [5]}', [])])
    done = run_cli("dlt", "replay", "-b", bootstrap, "--dlt-topic", dlt, "--to", "original")
    assert done.exit_code == 2, done.output
    assert f"(key '{dlt}/0/0') is not a replay log entry: b'not json {{'" in done.stderr
    assert topic_sizes(bootstrap, topic)[topic] == 0  # nothing published
    # A listing leaves it out, and lists the rest.
    client = TestClient(create_app(bootstrap, timeout_s=5.0))
    listed = client.get(f"/api/replays?dlt={dlt}")
    assert listed.status_code == 200 and listed.json() == []
    assert client.get(f"/replays?dlt={dlt}").status_code == 200  # its fields are not computed on


def test_only_the_selected_records_log_entries_are_read(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    """The log keeps every record ever replayed: a replay decodes only its selection's entries,
    so a bad entry of another record neither stops it nor costs it a decode."""
    topic, group = new_topic(), unique_name("selected-log")
    dlt = new_topic()
    headers = [(h.REASON, b"exhausted"), (h.GROUP, group.encode()),
               (h.ORIGINAL_TOPIC, topic.encode()), (h.ORIGINAL_PARTITION, b"0"),
               (h.ORIGINAL_OFFSET, b"0")]
    produce_records(bootstrap, dlt, [(b"a", b"v", headers), (b"b", b"w", headers)])
    produce_records(bootstrap, REPLAY_LOG, [(f"{dlt}/0/1".encode(), b"not json {", [])])
    base = ["dlt", "replay", "-b", bootstrap, "--dlt-topic", dlt, "--to", "original"]
    done = run_cli(*base, "--record", "0:0")
    assert done.exit_code == 0, done.output
    assert [m.key for m in read_all(bootstrap, topic)] == [b"a"]
    done = run_cli(*base)  # the whole topic: 0:1's entry is read, and stops it
    assert done.exit_code == 2, done.output
    assert f"(key '{dlt}/0/1') is not a replay log entry" in done.stderr
    assert [m.key for m in read_all(bootstrap, topic)] == [b"a"]


def test_a_named_record_the_topic_does_not_hold_is_refused_naming_it(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, dlt = new_topic(), new_topic()
    headers = [(h.REASON, b"exhausted"), (h.GROUP, b"g"), (h.ORIGINAL_TOPIC, topic.encode()),
               (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"0")]
    produce_records(bootstrap, dlt, [(b"k", b"v", headers)])
    transactional = kafka.producer(bootstrap, transactional_id=unique_name("dlt-writer"))
    transactional.init_transactions(10)
    transactional.begin_transaction()
    transactional.produce(dlt, value=b"w", key=b"k", headers=headers, partition=0)
    transactional.commit_transaction(10)  # the record at 1, its commit marker at 2
    base = ["dlt", "replay", "-b", bootstrap, "--dlt-topic", dlt, "--to", "original"]
    for record, why in [("7:0", f"{dlt} has partitions 0..0"),
                        ("0:99", f"{dlt}[0] holds no record there (offsets 0..2)"),
                        ("0:2", f"{dlt}[0] holds no record there (a transaction's marker")]:
        done = run_cli(*base, "--record", record)
        assert done.exit_code == 2, done.output
        assert f"invalid record='{record}': {why}" in done.stderr
    done = run_cli(*base, "--record", "0:0")
    assert done.exit_code == 0, done.output
    assert [r.value for r in read_all(bootstrap, topic, expect=1)] == [b"v"]


def test_named_records_are_read_once_for_their_check_and_replay(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The console checked the named records, replay checked them again, then read them: three
    reads of the same offsets, each about a fifth of a replay of 5,000 records."""
    topic, dlt = new_topic(), new_topic()
    headers = [(h.REASON, b"exhausted"), (h.GROUP, b"g"), (h.ORIGINAL_TOPIC, topic.encode()),
               (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"0")]
    produce_records(bootstrap, dlt, [(b"a", b"v", headers), (b"b", b"w", headers)])
    reads: list[str] = []
    real = deadletters.read_topic

    def counted(connection: kafka.Connection, name: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(name)
        return real(connection, name, *args, **kwargs)

    monkeypatch.setattr(deadletters, "read_topic", counted)
    web = TestClient(create_app(bootstrap, token="t"))
    done = web.post("/api/replay", json={"dlt": dlt, "records": ["0:1"], "to": "original",
                                         "dry_run": False}, headers={"Authorization": "Bearer t"})
    assert done.status_code == 200, done.text
    assert [item["source"] for item in done.json()["replayed"]] == [[dlt, 0, 1]]
    assert reads.count(dlt) == 1
    assert [m.key for m in read_all(bootstrap, topic, expect=1)] == [b"b"]
    # the selection's other conditions still apply to the records it names
    named = deadletters.DeadLetterFilter(coordinates=frozenset({(0, 0)}))
    assert replay(bootstrap, dlt, to=TO_ORIGINAL, dry_run=True, selection=named).selected == 1
    report = replay(bootstrap, dlt, to=TO_ORIGINAL, dry_run=True, selection=dataclasses.replace(
        named, reasons=frozenset({"malformed"})))
    assert report.selected == 0


def test_a_transaction_left_open_on_the_replay_log_stops_a_replay_rather_than_repeat_one(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    """Read committed, the log ends short of a transaction still open on it (another topic's
    replay running, or crashed): an entry committed past that point went unseen, and its record
    was published again by the next replay."""
    topic, group, dlt = new_topic(), unique_name("open-log"), new_topic()
    produce_records(bootstrap, dlt, [(b"k", b"v", [
        (h.REASON, b"exhausted"), (h.GROUP, group.encode()), (h.ORIGINAL_TOPIC, topic.encode()),
        (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"0")])])
    kafka.create_topics(kafka.admin(bootstrap), {REPLAY_LOG: 1}, config=LOG_CONFIG)
    other = kafka.producer(bootstrap, transactional_id=unique_name("other-replay"))
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(REPLAY_LOG, key=f"{new_topic()}/0/0".encode(), value=b"{}")
    other.flush(10)
    try:
        for _ in range(2):
            with pytest.raises(ReplayFailed, match="stuck at offset"):
                replay(bootstrap, dlt, to=TO_ORIGINAL, timeout_s=2.0)
        assert topic_sizes(bootstrap, topic)[topic] == 0
    finally:
        other.abort_transaction(10)
    assert len(replay(bootstrap, dlt, to=TO_ORIGINAL).replayed) == 1
    again = replay(bootstrap, dlt, to=TO_ORIGINAL)
    assert again.replayed == [] and len(again.already) == 1
    assert [r.value for r in read_all(bootstrap, topic, expect=1)] == [b"v"]


def test_a_dead_letter_topic_created_again_has_its_new_records_replayed(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    """Deleted and created again (a purge), the topic's offsets start over: the log's entries
    of its former records held the new ones' coordinates, which were taken as replayed."""
    topic, group, dlt = new_topic(), unique_name("recreated"), new_topic()
    headers = [(h.REASON, b"exhausted"), (h.GROUP, group.encode()),
               (h.ORIGINAL_TOPIC, topic.encode()), (h.ORIGINAL_PARTITION, b"0"),
               (h.ORIGINAL_OFFSET, b"0")]
    produce_records(bootstrap, dlt, [(b"k", b"old", headers)])
    assert len(replay(bootstrap, dlt, to=TO_ORIGINAL).replayed) == 1
    kafka.delete_topics(kafka.admin(bootstrap), [dlt])
    wait_until(lambda: dlt not in kafka.topic_partitions(kafka.admin(bootstrap)), 10,
               "the topic deleted")
    kafka.create_topics(kafka.admin(bootstrap), {dlt: 1})
    time.sleep(0.01)  # a later timestamp than the former record's
    produce_records(bootstrap, dlt, [(b"k", b"new", headers)])
    client = TestClient(create_app(bootstrap, timeout_s=5.0))
    assert client.get(f"/api/dead-letters/{dlt}/0/0").json()["replays"] == []
    done = replay(bootstrap, dlt, to=TO_ORIGINAL)
    assert len(done.replayed) == 1 and done.already == []
    assert [r.value for r in read_all(bootstrap, topic, expect=2)] == [b"old", b"new"]
    again = replay(bootstrap, dlt, to=TO_ORIGINAL)
    assert again.replayed == [] and len(again.already) == 1
    [entry] = client.get(f"/api/dead-letters/{dlt}/0/0").json()["replays"]
    assert entry["replay_id"] == done.replay_id
