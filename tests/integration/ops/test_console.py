"""The operations console's pages and JSON API on noida-db (FastAPI's TestClient): dead letters
written by a real consumer, listed, filtered, grouped by cause and shown; a replay's dry run and
the replay itself, which needs the token; escaping; bad input and a broker that is down; the
overview's last hour and day; a time window's end; a record's every replay."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from redrive import headers as h
from redrive import kafka
from redrive.clock import now_ms
from redrive.consumer import RetryingConsumer
from redrive.ops import activity
from redrive.ops.console import fingerprint
from redrive.ops.replay import read_log
from redrive.ops.waiting import DelayTiers
from redrive.ops.web import create_app
from redrive.policy import Backoff, RetryPolicy
from redrive.record import Record
from redrive.store import RetryStore
from redrive.store.rows import Entry
from redrive.store.schema import CANCELLED, DEAD, IN_FLIGHT, PARKED, PENDING, retries

from ..consumer.conftest import FAST_GROUP, Running, read_all, wait_until
from ..records import produce_input
from .conftest import produce_records, run_cli, topic_sizes

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
Start = Callable[[RetryingConsumer], Running]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MINUTE_MS = 60_000


class BadOrder(Exception):
    pass


def reject(record: Record) -> None:
    value = record.value or b""
    if value.startswith(b"bad"):
        raise BadOrder(f"order {value.decode()} has no lines (id 0x{len(value):x})")
    if value.startswith(b"<"):
        raise ValueError("markup is not an order")


@pytest.fixture
def dead_letters(bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
                 running: Start) -> Iterator[tuple[str, str, str]]:
    """(main topic, group, dead-letter topic) holding 6 dead letters: five BadOrder (exhausted:
    one attempt), one ValueError (not retryable) whose value is markup."""
    topic, group = new_topic(), unique_name("console")
    policy = RetryPolicy(backoff=Backoff.fixed("100ms"), attempts=1, not_retryable=ValueError)
    produce_records(bootstrap, topic, [(b"k%d" % i, b"bad-%d" % i, [("trace-id", b"t%d" % i)])
                                       for i in range(5)]
                    + [(b"k9", b"ok", []), (b"k5", b"<script>alert(1)</script>", [])])
    run = running(RetryingConsumer(bootstrap, topic, group, policy, reject, config=FAST_GROUP))
    wait_until(lambda: run.total("redrive_dead_lettered_total") == 6, 30, "6 dead letters")
    yield topic, group, f"{topic}.{group}.dlt"


def client(bootstrap: str, token: str | None = TOKEN) -> TestClient:
    return TestClient(create_app(bootstrap, token=token, timeout_s=5.0))


def test_pages_list_filter_group_and_show_dead_letters(
        bootstrap: str, dead_letters: tuple[str, str, str]) -> None:
    topic, group, dlt = dead_letters
    web = client(bootstrap)
    listed = {t["name"]: t for t in web.get("/api/dead-letter-topics").json()}
    assert listed[dlt] == {"name": dlt, "topic": topic, "group": group, "records": 6}
    assert dlt in web.get("/").text
    health = {g["dead_letter_topic"]: g for g in web.get("/api/groups").json()}[dlt]
    assert (health["topic"], health["group"], health["dead_letters"]) == (topic, group, 6)
    assert (health["lag"], health["waiting_retries"], health["problem"]) == (0, 0, None)

    everything = web.get(f"/api/dead-letters/{dlt}").json()
    assert (everything["matched"], everything["complete"], everything["size"]) == (6, True, 6)
    stamps = [r["timestamp_ms"] for r in everything["records"]]
    assert stamps == sorted(stamps, reverse=True)  # newest first
    groups = {g["fingerprint"]: g["count"] for g in everything["groups"]}
    bad = fingerprint(f"{__name__}.BadOrder", "order bad-0 has no lines (id 0x5)")
    assert groups == {bad: 5, "ValueError: markup is not an order": 1}

    only_bad = web.get(f"/api/dead-letters/{dlt}", params={"fp": bad}).json()
    assert only_bad["matched"] == 5
    by_type = web.get(f"/api/dead-letters/{dlt}", params={"error_type": "ValueError"}).json()
    assert [r["key"] for r in by_type["records"]] == ["k5"]
    by_header = web.get(f"/api/dead-letters/{dlt}", params={"q": "t3"}).json()
    assert [r["key"] for r in by_header["records"]] == ["k3"]
    assert web.get(f"/api/dead-letters/{dlt}", params={"reason": "exhausted"}).json()[
        "matched"] == 5
    assert [r["key"] for r in web.get(f"/api/dead-letters/{dlt}", params={
        "reason": "not-retryable"}).json()["records"]] == ["k5"]
    page = web.get(f"/dead-letters/{dlt}", params={"q": "bad-2"})
    assert page.status_code == 200 and ">1</span> record(s)" in page.text

    markup = by_type["records"][0]
    shown = web.get(f"/dead-letters/{dlt}/{markup['partition']}/{markup['offset']}")
    assert shown.status_code == 200
    assert "<script>alert(1)</script>" not in shown.text  # read from Kafka, shown as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown.text
    assert h.ORIGINAL_TOPIC in shown.text and "markup is not an order" in shown.text


def test_a_replay_needs_the_token_and_runs_through_the_replay_log(
        bootstrap: str, dead_letters: tuple[str, str, str]) -> None:
    topic, _, dlt = dead_letters
    web = client(bootstrap)
    wanted = {"dlt": dlt, "error_type": "BadOrder", "to": "original"}
    assert web.post("/api/replay", json=wanted).status_code == 401
    assert web.post("/api/replay", json=wanted,
                    headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client(bootstrap, token=None).post(
        "/api/replay", json=wanted, headers={"Authorization": f"Bearer {TOKEN}"}
    ).status_code == 403  # started without a token: read-only
    refused = web.post(f"/dead-letters/{dlt}/replay", data={"token": TOKEN, "dry_run": "1"},
                       headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403
    assert topic_sizes(bootstrap, topic)[topic] == 7

    auth = {"Authorization": f"Bearer {TOKEN}"}
    dry = web.post("/api/replay", json=wanted, headers=auth).json()
    assert (dry["dry_run"], dry["selected"], len(dry["planned"])) == (True, 5, 5)
    assert topic_sizes(bootstrap, topic)[topic] == 7 and read_log(bootstrap, dlt) == {}

    done = web.post("/api/replay", json={**wanted, "dry_run": False}, headers=auth).json()
    assert len(done["replayed"]) == 5 and {d["destination"][0] for d in done["replayed"]} == {
        topic}
    copies = read_all(bootstrap, topic, expect=12, timeout_s=20)[7:]
    assert sorted(c.value for c in copies) == [b"bad-%d" % i for i in range(5)]
    assert len(read_log(bootstrap, dlt)) == 5
    log = web.get("/api/replays", params={"dlt": dlt}).json()
    assert len(log) == 5 and {e["who"] for e in log} == {"redrive ui"}
    source = done["replayed"][0]["source"]
    shown = web.get(f"/dead-letters/{dlt}/{source[1]}/{source[2]}").text
    destination = done["replayed"][0]["destination"]
    replayed = shown.split('id="replayed-before">', 1)[1].split("</p>", 1)[0]
    assert destination[0] in replayed and f"{destination[1]}:{destination[2]}" in replayed
    assert dlt in web.get("/replays").text
    # The same five again (the consumer, still failing them, has meanwhile dead-lettered the
    # copies anew: those are other records), by their coordinates: the log says they are done.
    same = [f"{p}:{o}" for (_, p, o) in (d["source"] for d in done["replayed"])]
    again = web.post("/api/replay", json={**wanted, "records": same, "dry_run": False},
                     headers=auth).json()
    assert (len(again["replayed"]), len(again["already_replayed"])) == (0, 5)


def test_bad_input_gets_a_clear_message(bootstrap: str, unique_name: UniqueName,
                                        dead_letters: tuple[str, str, str]) -> None:
    _, _, dlt = dead_letters
    web = client(bootstrap)
    missing = unique_name("nothing") + ".dlt"
    page = web.get(f"/dead-letters/{missing}")
    assert page.status_code == 404 and missing in page.text and "Traceback" not in page.text
    assert web.get(f"/api/dead-letters/{missing}").status_code == 404
    since = web.get(f"/api/dead-letters/{dlt}", params={"since": "yesterday-ish"})
    assert since.status_code == 400 and "since" in since.json()["detail"]
    assert web.get(f"/dead-letters/{dlt}/0/999999").status_code == 404
    to = web.post("/api/replay", json={"dlt": dlt, "to": "elsewhere"},
                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert to.status_code == 400 and "elsewhere" in to.json()["detail"]


def test_a_broker_that_is_down_shows_as_down() -> None:
    web = TestClient(create_app("127.0.0.1:1", token=TOKEN, timeout_s=1.0))
    page = web.get("/")
    assert page.status_code == 503 and 'id="broker-down"' in page.text
    assert web.get("/api/dead-letter-topics").status_code == 503
    # Every page and call that reads the cluster: 503 naming it (they were 500s).
    dlt = "orders.billing.dlt"
    for path in [f"/api/dead-letters/{dlt}", f"/api/dead-letters/{dlt}/0/0"]:
        answer = web.get(path)
        assert answer.status_code == 503, path
        assert "no Kafka broker reachable at bootstrap.servers='127.0.0.1:1'" in \
            answer.json()["detail"]
    for path in [f"/dead-letters/{dlt}", f"/dead-letters/{dlt}/0/0"]:
        answer = web.get(path)
        assert answer.status_code == 503 and "no Kafka broker reachable" in answer.text, path
    replay = web.post("/api/replay", json={"dlt": dlt, "records": ["0:0"]}, headers=AUTH)
    assert replay.status_code == 503 and "no Kafka broker reachable" in replay.json()["detail"]


def test_a_large_topic_is_read_from_its_end_only_as_far_as_the_page_needs(
        bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic(partitions=1)
    produce_records(bootstrap, dlt, [(None, b"v-%d" % i, []) for i in range(2_500)])
    web = client(bootstrap)
    first = web.get(f"/api/dead-letters/{dlt}").json()
    assert (first["complete"], first["read"], first["size"]) == (False, 500, 2_500)
    assert [r["offset"] for r in first["records"]] == list(range(2_499, 2_449, -1))
    second = web.get(f"/api/dead-letters/{dlt}", params={"page": 2}).json()
    assert [r["offset"] for r in second["records"]] == list(range(2_449, 2_399, -1))
    # A filter whose newest match lies further back reads back as far as it.
    ones = web.get(f"/api/dead-letters/{dlt}", params={"q": "v-1"}).json()
    assert [r["offset"] for r in ones["records"]][:2] == [1_999, 1_998]
    assert ones["complete"] and ones["matched"] == 1 + 10 + 100 + 1_000
    whole = web.get(f"/api/dead-letters/{dlt}", params={"everything": "true"}).json()
    assert (whole["complete"], whole["matched"]) == (True, 2_500)
    page = web.get(f"/dead-letters/{dlt}")
    assert "At least" in page.text and 'id="read-all"' in page.text


def test_pages_keep_each_partitions_log_order_when_timestamps_go_backwards(
        bootstrap: str, new_topic: NewTopic) -> None:
    """A record's timestamp is its producer's clock: a record written earlier may carry a later
    one. Pages read only the topic's end must agree with pages of the whole topic, so that no
    record falls between two pages."""
    dlt = new_topic(partitions=2)
    at = now_ms()
    records = [kafka.OutRecord(dlt, b"v-%d-%d" % (p, i), None, (), p, at + 10 * i + p)
               for p in (0, 1) for i in range(600)]
    # The first of partition 0, from a producer whose clock ran an hour fast.
    records[0] = kafka.OutRecord(dlt, b"fast", None, (), 0, at + 3_600_000)
    produce_input(bootstrap, records)
    web = client(bootstrap)

    def offsets(everything: bool) -> list[tuple[int, int]]:
        shown = []
        for page in range(1, 26):
            found = web.get(f"/api/dead-letters/{dlt}",
                            params={"page": page, "everything": everything}).json()
            shown += [(r["partition"], r["offset"]) for r in found["records"]]
        return shown

    whole = offsets(everything=True)
    assert offsets(everything=False) == whole
    assert sorted(whole) == sorted((p, o) for p in (0, 1) for o in range(600))
    # Newest first across partitions, each from its end back to its start: the fast record
    # comes where partition 0's log reaches it, not first.
    assert whole[:3] == [(1, 599), (0, 599), (1, 598)]
    assert whole[-4:] == [(1, 1), (0, 1), (0, 0), (1, 0)]


def test_the_store_page_counts_rows_and_requeues_or_cancels_with_the_token(
        bootstrap: str, tmp_path: Path) -> None:
    store = RetryStore(str(tmp_path / "store.db"))
    try:
        at = now_ms()
        rows = [Entry(group="billing", topic="orders", partition=0, offset=o, timestamp_ms=at,
                      key=None, mode="payload", value=b"v", headers=[], target=None, attempt=1,
                      first_failure_ms=at, due_ms=at + 60_000,
                      status=DEAD if o < 2 else PENDING, reason="exhausted" if o < 2 else None,
                      error_type="app.Boom", error_message="boom", error_trace="",
                      ordered=False) for o in range(5)]
        store.write(rows, [])
        web = TestClient(create_app(bootstrap, token=TOKEN, store=store, timeout_s=5.0))
        listed = web.get("/api/store").json()
        assert [(r["group"], r["topic"], r["dead"], r["pending"]) for r in listed] == [
            ("billing", "orders", 2, 3)]
        assert "Requeue dead" in web.get("/store").text
        act = {"group": "billing", "status": DEAD}
        assert web.post("/api/store/requeue", json=act).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert web.post("/api/store/requeue", json=act, headers=auth).json() == {"rows": 2}
        assert store.counts() == {PENDING: 5}
        wrong = web.post("/api/store/cancel", json=act, headers=auth)
        assert wrong.status_code == 400 and "status" in wrong.json()["detail"]
        unknown = web.post("/api/store/delete", json=act, headers=auth)
        assert unknown.status_code == 400
        assert unknown.json()["detail"] == ("invalid action='delete': expected 'requeue' or "
                                            "'cancel'")
        cancelled = web.post("/store/cancel", data={"group": "billing", "status": PENDING,
                                                    "token": TOKEN})
        assert cancelled.status_code == 200 and "cancel: 5 row(s) of billing" in cancelled.text
        assert store.counts() == {CANCELLED: 5}
        assert TestClient(create_app(bootstrap)).get("/api/store").status_code == 404
    finally:
        store.close()


def written(bootstrap: str, records: list[tuple[str, int, int, list[tuple[str, bytes]]]],
            at_ms: int) -> None:
    """(topic, partition, minutes before at_ms, headers) records, stamped that long ago; each
    partition's in time order, as the broker looks times up by offset."""
    produce_input(bootstrap, [
        kafka.OutRecord(topic, b"v", None, headers, partition, at_ms - minutes * MINUTE_MS)
        for topic, partition, minutes, headers in records])


def dead(reason: str) -> list[tuple[str, bytes]]:
    return [(h.REASON, reason.encode()), (h.GROUP, b"billing")]


def test_the_overview_counts_the_last_hour_and_day_by_reason_and_rates(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = new_topic(), unique_name("activity")
    retry = new_topic(name=f"{topic}.{group}.retry.5s")
    dlt = new_topic(partitions=2, name=f"{topic}.{group}.dlt")
    day, hour = 24 * 60, 60
    written(bootstrap, [(topic, 0, minutes, []) for minutes in (day + 360, 180, 120, 10, 5, 1)]
            + [(retry, 0, minutes, []) for minutes in (day + 60, 300, 50, 1)]
            + [(dlt, 0, day + 360, dead("exhausted")), (dlt, 0, 300, dead("not-retryable")),
               (dlt, 0, 50, dead("exhausted")), (dlt, 0, 20, []),  # names no reason
               (dlt, 0, 1, dead("exhausted")),
               (dlt, 1, 300, dead("not-retryable")), (dlt, 1, 40, dead("deadline")),
               (dlt, 1, 10, dead("exhausted"))], now_ms())
    assert hour < 300 < day
    web = client(bootstrap)

    found = {g["dead_letter_topic"]: g for g in web.get("/api/groups").json()}[dlt]
    assert (found["topic"], found["group"], found["problem"]) == (topic, group, None)
    recent = found["activity"]
    assert recent["received"] == {"hour": 3, "day": 5, "per_minute": 0.05}
    assert recent["retries"] == {"hour": 2, "day": 3, "per_minute": 0.033}
    assert recent["dead_letters"] == {"hour": 5, "day": 7, "per_minute": 0.083}
    assert recent["reasons_hour"] == {
        "counts": {"exhausted": 3, "deadline": 1, "unknown": 1}, "complete": True}
    assert recent["reasons_day"] == {
        "counts": {"exhausted": 3, "not-retryable": 2, "deadline": 1, "unknown": 1},
        "complete": True}
    row = web.get("/").text.split(dlt, 2)[2].split("</tr>", 1)[0]
    hour_cell = row.split('class="dead-hour">', 1)[1].split("</td>", 1)[0]
    assert hour_cell.startswith("5") and "exhausted 3" in hour_cell and "at least" not in row
    assert "not-retryable 2" in row.split('class="dead-day">', 1)[1]
    assert "0.05 in, 0.033 to retry" in row and "0.083 dead" in row

    # Reading at most 6 dead letters of the day's 7: each partition's newest, by its share,
    # which covers the last hour but not the day.
    monkeypatch.setattr(activity, "READ_CAP", 6)
    capped = {g["dead_letter_topic"]: g for g in web.get("/api/groups").json()}[dlt]["activity"]
    assert capped["reasons_hour"] == recent["reasons_hour"]
    assert capped["reasons_day"] == {"counts": recent["reasons_hour"]["counts"],
                                     "complete": False}
    assert capped["dead_letters"]["day"] == 7  # from offsets: exact, capped or not
    row = web.get("/").text.split(dlt, 2)[2].split("</tr>", 1)[0]
    assert "at least" in row.split('class="dead-day">', 1)[1]
    assert "at least" not in row.split('class="dead-hour">', 1)[1].split("</td>", 1)[0]


def test_a_group_whose_name_holds_a_dot_is_told_from_its_topic(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("billing") + ".v2"
    retry = new_topic(name=f"{topic}.{group}.retry.5s")
    dlt = new_topic(name=f"{topic}.{group}.dlt")
    written(bootstrap, [(retry, 0, 3, []), (dlt, 0, 2, dead("exhausted"))], now_ms())
    found = {g["dead_letter_topic"]: g for g in client(bootstrap).get("/api/groups").json()}[dlt]
    # Split at its last dot, the name read as topic `<topic>.billing-...` and group `v2`.
    assert (found["topic"], found["group"], found["problem"]) == (topic, group, None)
    assert found["activity"]["dead_letters"]["hour"] == 1


def story(origin: str, offset: int) -> list[tuple[str, bytes]]:
    """A dead letter's headers naming the record it came from, so that it can be replayed."""
    return [*dead("exhausted"), (h.ORIGINAL_TOPIC, origin.encode()),
            (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, str(offset).encode())]


def test_until_ends_the_time_window_of_the_view_the_api_and_a_replay(
        bootstrap: str, new_topic: NewTopic) -> None:
    origin, dlt = new_topic(), new_topic()
    at = now_ms()
    produce_input(bootstrap, [
        kafka.OutRecord(dlt, value, value, story(origin, offset), 0, at - minutes * MINUTE_MS)
        for offset, (value, minutes) in enumerate(((b"old", 180), (b"middle", 90),
                                                   (b"new", 10)))])
    web = client(bootstrap)

    def keys(**params: str) -> list[str]:
        answer = web.get(f"/api/dead-letters/{dlt}", params=params)
        assert answer.status_code == 200, answer.text
        return [record["key"] for record in answer.json()["records"]]

    window = {"since": "2h", "until": "30m"}
    assert keys(**window) == ["middle"]
    assert keys(until="30m") == ["middle", "old"]
    iso = datetime.fromtimestamp((at - 100 * MINUTE_MS) / 1000, UTC).isoformat()
    assert keys(until=iso) == ["old"]
    page = web.get(f"/dead-letters/{dlt}", params=window)
    assert page.status_code == 200 and ">1</span> record(s)" in page.text
    assert 'name="until" value="30m"' in page.text  # in the filter form
    assert '<input type="hidden" name="until" value="30m">' in page.text  # in the replay form

    bad = web.get(f"/api/dead-letters/{dlt}", params={"until": "soon"})
    assert bad.status_code == 400 and "until" in bad.json()["detail"]
    bad_page = web.get(f"/dead-letters/{dlt}", params={"until": "soon"})
    assert bad_page.status_code == 400 and "until" in bad_page.text
    reversed_window = web.get(f"/api/dead-letters/{dlt}", params={"since": "1h", "until": "2h"})
    assert reversed_window.status_code == 400 and "since" in reversed_window.json()["detail"]
    bad_replay = web.post("/api/replay", json={"dlt": dlt, "to": "original", "until": "soon"},
                          headers=AUTH)
    assert bad_replay.status_code == 400 and "until" in bad_replay.json()["detail"]

    dry = web.post(f"/dead-letters/{dlt}/replay", data={"token": TOKEN, "dry_run": "1",
                                                        **window})
    assert dry.status_code == 200 and '<span id="planned">1</span>' in dry.text
    done = web.post("/api/replay", json={"dlt": dlt, "to": "original", "dry_run": False,
                                         **window}, headers=AUTH).json()
    assert (done["selected"], [d["source"] for d in done["replayed"]]) == (1, [[dlt, 0, 1]])
    assert [c.value for c in read_all(bootstrap, origin, expect=1)] == [b"middle"]


def test_a_record_replayed_again_shows_every_replay(bootstrap: str, new_topic: NewTopic) -> None:
    origin, dlt = new_topic(), new_topic()
    produce_input(bootstrap, [
        kafka.OutRecord(dlt, b"v", b"k", story(origin, 7), 0)])
    web = client(bootstrap)
    one = {"dlt": dlt, "records": ["0:0"], "to": "original", "dry_run": False}

    # A record the topic does not hold is refused, not "replayed" with nothing selected.
    for place, why in [("0:9", f"{dlt}[0] holds no record there (offsets 0..0)"),
                       ("3:0", f"{dlt} has partitions 0..0")]:
        missing = web.post("/api/replay", json={**one, "records": [place]}, headers=AUTH)
        assert missing.status_code == 400
        assert missing.json()["detail"] == f"invalid records='{place}': {why}"
    first = web.post("/api/replay", json=one, headers=AUTH).json()
    left = web.post("/api/replay", json=one, headers=AUTH).json()
    assert (len(left["replayed"]), left["already_replayed"]) == (0, [[dlt, 0, 0]])
    dry = web.post("/api/replay", json={**one, "again": True, "dry_run": True},
                   headers=AUTH).json()
    assert len(dry["planned"]) == 1 and len(read_all(bootstrap, origin, expect=1)) == 1
    second = web.post("/api/replay", json={**one, "again": True}, headers=AUTH).json()
    assert len(second["replayed"]) == 1 and second["replay_id"] != first["replay_id"]

    replays = web.get(f"/api/dead-letters/{dlt}/0/0").json()["replays"]
    assert [r["replay_id"] for r in replays] == [second["replay_id"], first["replay_id"]]
    assert [r["destination"]["offset"] for r in replays] == [
        second["replayed"][0]["destination"][2], first["replayed"][0]["destination"][2]]
    assert {(r["who"], r["to"]) for r in replays} == {("redrive ui", "original")}
    assert replays[0]["when_ms"] >= replays[1]["when_ms"]
    page = web.get(f"/dead-letters/{dlt}/0/0").text
    history = page.split('id="replay-history">', 1)[1].split("</table>", 1)[0]
    assert history.count("<tr>") == 3  # a heading and two replays
    assert first["replay_id"] in history and second["replay_id"] in history

    # The CLI's replay, again, goes through the same log and keeps both.
    cli = run_cli("dlt", "replay", "-b", bootstrap, "--dlt-topic", dlt, "--to", "original",
                  "--record", "0:0", "--again", "--actor", "oncall@test")
    assert cli.exit_code == 0 and "replayed 1 of 1" in cli.stdout, cli.output
    assert cli.stderr == ""  # no progress bar off a terminal, not even its label
    replays = web.get(f"/api/dead-letters/{dlt}/0/0").json()["replays"]
    assert [r["who"] for r in replays] == ["oncall@test", "redrive ui", "redrive ui"]
    entry = web.get("/api/replays", params={"dlt": dlt}).json()[0]
    assert (entry["replays"], len(entry["history"])) == (3, 2)
    assert [c.value for c in read_all(bootstrap, origin, expect=3)] == [b"v"] * 3
    assert web.get(f"/api/dead-letters/{dlt}/0/9").status_code == 404


def failed(origin: str, offset: int, message: str | None) -> list[tuple[str, bytes]]:
    """The story of a dead letter whose error says `message` (None: says nothing)."""
    error = [] if message is None else [(h.ERROR_TYPE, b"app.Boom"),
                                        (h.ERROR_MESSAGE, message.encode())]
    return [*story(origin, offset), *error]


def test_a_message_regex_filters_the_view_the_api_and_a_replay(
        bootstrap: str, new_topic: NewTopic) -> None:
    origin, dlt = new_topic(), new_topic()
    messages = ["timeout after 30s talking to db-1", "Timeout after 5s talking to db-2",
                "order 17 has no lines", "timeout reading the order", "timeout after 9s",
                None]
    at = now_ms()
    produce_input(bootstrap, [
        kafka.OutRecord(dlt, b"v", b"k%d" % offset, failed(origin, offset, message), 0,
                        at - (10 - offset) * MINUTE_MS)
        for offset, message in enumerate(messages)])
    web = client(bootstrap)
    wanted = {"message": r"^timeout after \d+s"}

    def matched(**params: str) -> tuple[int, list[str]]:
        answer = web.get(f"/api/dead-letters/{dlt}", params=params)
        assert answer.status_code == 200, answer.text
        found = answer.json()
        return found["matched"], [record["key"] for record in found["records"]]

    assert matched(**wanted) == (2, ["k4", "k0"])  # re.search: case and anchor hold
    assert matched(message="(?i)TIMEOUT") == (4, ["k4", "k3", "k1", "k0"])
    assert matched(message="no lines|db-2") == (2, ["k2", "k1"])
    assert matched(message=".*") == (5, ["k4", "k3", "k2", "k1", "k0"])  # k5 has no message
    assert matched(message="talking", q="k1") == (1, ["k1"])  # with the other filters
    assert matched(message="") == (6, ["k5", "k4", "k3", "k2", "k1", "k0"])
    page = web.get(f"/dead-letters/{dlt}", params=wanted)
    assert page.status_code == 200 and ">2</span> record(s)" in page.text
    assert "message matches" in page.text
    assert r'name="message" value="^timeout after \d+s"' in page.text  # in the filter form
    assert r'<input type="hidden" name="message" value="^timeout after \d+s">' in page.text

    dry = web.post(f"/dead-letters/{dlt}/replay", data={"token": TOKEN, "dry_run": "1",
                                                        **wanted})
    assert dry.status_code == 200 and '<span id="planned">2</span>' in dry.text
    done = web.post("/api/replay", json={"dlt": dlt, "to": "original", "dry_run": False,
                                         **wanted}, headers=AUTH).json()
    assert (done["selected"], sorted(d["source"] for d in done["replayed"])) == (
        2, [[dlt, 0, 0], [dlt, 0, 4]])
    # Counted by reading: the replay's transaction marker takes an offset too.
    assert sorted(c.key for c in read_all(bootstrap, origin, expect=2)) == [b"k0", b"k4"]
    assert len(read_log(bootstrap, dlt)) == 2


def test_an_invalid_message_regex_names_the_field(bootstrap: str, new_topic: NewTopic) -> None:
    origin, dlt = new_topic(), new_topic()
    produce_input(bootstrap, [
        kafka.OutRecord(dlt, b"v", b"k", failed(origin, 0, "boom"), 0)])
    web = client(bootstrap)
    bad = {"message": "("}

    answer = web.get(f"/api/dead-letters/{dlt}", params=bad)
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("invalid message='(': not a regular expression")
    page = web.get(f"/dead-letters/{dlt}", params=bad)
    assert page.status_code == 400 and "Traceback" not in page.text
    assert "invalid message=&#39;(&#39;: not a regular expression" in page.text
    replay = web.post("/api/replay", json={"dlt": dlt, "to": "original", "dry_run": False,
                                           **bad}, headers=AUTH)
    assert replay.status_code == 400 and "invalid message='('" in replay.json()["detail"]
    form = web.post(f"/dead-letters/{dlt}/replay", data={"token": TOKEN, **bad})
    assert form.status_code == 400 and "invalid message=&#39;(&#39;" in form.text
    assert topic_sizes(bootstrap, origin)[origin] == 0 and read_log(bootstrap, dlt) == {}


def test_the_overview_shows_retries_waiting_in_the_store_and_the_delay_tiers(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, tmp_path: Path) -> None:
    topic, group = new_topic(1), "waits"
    dlt = f"{topic}.{group}.dlt"
    prefix = unique_name("tiers")
    kafka.create_topics(kafka.admin(bootstrap), {dlt: 1, f"{prefix}.1s": 2, f"{prefix}.dlt": 1})
    at = now_ms()
    written(bootstrap, [(dlt, 0, 1, [(h.REASON, b"exhausted"), (h.GROUP, group.encode())])], at)

    def copy(partition: int, minutes: int, owner: str, target: str, due: int
             ) -> tuple[str, int, int, list[tuple[str, bytes]]]:
        return (f"{prefix}.1s", partition, minutes, [
            (h.GROUP, owner.encode()), (h.TARGET, target.encode()), (h.DUE, b"%d" % due)])

    # Three of this group's copies back to its topic; others of another group or topic.
    written(bootstrap, [copy(0, 5, group, topic, at + 9_000), copy(0, 4, "other", topic, at),
                        copy(0, 3, group, topic, at + 7_000), copy(1, 2, group, topic, at + 8_000),
                        copy(1, 1, group, "elsewhere", at)], at)
    store = RetryStore(str(tmp_path / "store.db"))
    try:
        store.write([Entry(group=owner, topic=topic, partition=0, offset=o, timestamp_ms=at,
                           key=None, mode="payload", value=b"v", headers=[], target=None,
                           attempt=1, first_failure_ms=at, due_ms=at + due, status=status,
                           reason=None, error_type="app.Boom", error_message="boom",
                           error_trace="", ordered=False)
                     for o, (owner, due, status) in enumerate([
                         (group, 60_000, PENDING), (group, 30_000, PENDING),
                         (group, 1_000, DEAD), ("other", 5_000, PENDING),
                         (group, -4_000, PENDING), (group, 2_000, PENDING)])], [])
        # A row parked behind an earlier record of its key (its due time is when it was
        # parked) and one published already: both wait, neither is the next due.
        with store._begin() as conn:
            for offset, status in ((4, PARKED), (5, IN_FLIGHT)):
                conn.execute(retries.update().where(retries.c.offset == offset)
                             .values(status=status))
        web = TestClient(create_app(bootstrap, store=store, timeout_s=5.0,
                                    delay=DelayTiers(prefix, unique_name("service"))))
        row = next(g for g in web.get("/api/groups").json()
                   if (g["group"], g["topic"]) == (group, topic))
        waits = {w["where"]: w for w in row["elsewhere"]}
        assert (waits["delay tiers"]["records"], waits["delay tiers"]["complete"]) == (3, True)
        assert waits["delay tiers"]["next_due_ms"] == at + 7_000
        assert waits["delay tiers"]["oldest_ms"] == at - 5 * MINUTE_MS
        assert (waits["store"]["records"], waits["store"]["next_due_ms"]) == (4, at + 30_000)
        assert waits["store"]["oldest_ms"] >= at
        page = web.get("/").text
        assert "3 in the delay tiers" in page and "4 in the store" in page
    finally:
        store.close()
