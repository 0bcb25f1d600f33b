"""The console against what a stranger or a bad record can send it (FastAPI's TestClient on
noida-db): a regular expression that would backtrack for ever, a header name that is not UTF-8,
a JSON value holding a lone surrogate, a replay log entry of the wrong shape, a Host header of
another site, a page number far past the topic, `everything=false`; a retry store that is down;
the token read from a file or the environment; cause links that keep the filters; no framing."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from redrive import headers as h
from redrive import kafka
from redrive.cli.console import ui_command
from redrive.ops.console import MAX_PAGE, Console, View
from redrive.ops.replay import LOG_CONFIG, REPLAY_LOG
from redrive.ops.web import LOCAL_HOSTS, create_app
from redrive.store import RetryStore

from ..records import produce_input
from ..test_kcat import kcat_path
from .conftest import produce_records, topic_sizes

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client(bootstrap: str, **options: Any) -> TestClient:
    return TestClient(create_app(bootstrap, token=TOKEN, timeout_s=5.0, **options))


def story(message: str, reason: str = "exhausted") -> list[tuple[str, bytes]]:
    return [(h.REASON, reason.encode()), (h.GROUP, b"billing"), (h.ERROR_TYPE, b"app.Boom"),
            (h.ERROR_MESSAGE, message.encode()), (h.ORIGINAL_TOPIC, b"orders"),
            (h.ORIGINAL_PARTITION, b"0"), (h.ORIGINAL_OFFSET, b"1")]


def test_a_backtracking_message_regex_answers_at_once(bootstrap: str,
                                                      new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k%d" % i, b"v", story(message))
                                     for i, message in enumerate(["a" * 32 + "!", "aaa"])])
    web = client(bootstrap)
    answers: list[Any] = []
    # Python's re takes 2**32 steps on this pattern and message, holding the GIL: run in a
    # thread so that the test fails instead of hanging.
    asking = threading.Thread(target=lambda: answers.append(web.get(
        f"/api/dead-letters/{dlt}", params={"message": "(a+)+$"})), daemon=True)
    asking.start()
    asking.join(20)
    assert answers, "the regular expression held the server"
    assert answers[0].status_code == 200 and answers[0].json()["matched"] == 1
    assert web.get(f"/api/dead-letters/{dlt}", params={"message": "a+!$"}).json()[
        "matched"] == 1
    lookahead = web.get(f"/api/dead-letters/{dlt}", params={"message": "a(?=!)"})
    assert lookahead.status_code == 400
    assert "invalid message='a(?=!)': not a regular expression (RE2 syntax" in \
        lookahead.json()["detail"]


def kcat_produce(bootstrap: str, topic: str, header: bytes, value: bytes) -> None:
    subprocess.run([kcat_path().encode(), b"-P", b"-b", bootstrap.encode(), b"-t",
                    topic.encode(), b"-p", b"0", b"-H", header], input=value + b"\n",
                   check=True, timeout=60, capture_output=True)


def test_a_header_name_that_is_not_utf8_flags_its_record_and_breaks_no_page(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName) -> None:
    topic, group = new_topic(), unique_name("bad-header")
    dlt = new_topic(name=f"{topic}.{group}.dlt")
    produce_records(bootstrap, dlt, [(b"good", b"v", story("boom"))], partition=0)
    kcat_produce(bootstrap, dlt, b"bad\xffname=v", b"stripped")
    # A retry topic of another group holding one too: that group shows its problem, the others
    # still show.
    other = unique_name("bad-retry")
    retry = new_topic(name=f"{topic}.{other}.retry.5s")
    other_dlt = new_topic(name=f"{topic}.{other}.dlt")
    produce_records(bootstrap, other_dlt, [(b"k", b"v", story("boom"))])
    kcat_produce(bootstrap, retry, b"bad\xffname=v", b"waiting")
    web = client(bootstrap)

    listed = web.get(f"/api/dead-letters/{dlt}")
    assert listed.status_code == 200, listed.text
    records = {record["offset"]: record for record in listed.json()["records"]}
    assert records[0]["problem"] is None
    assert "its headers cannot be read (a header name is not UTF-8)" in records[1]["problem"]
    assert web.get(f"/dead-letters/{dlt}").status_code == 200
    assert web.get(f"/dead-letters/{dlt}/0/1").status_code == 200
    assert web.get(f"/api/dead-letters/{dlt}/0/1").json()["headers"] == []
    groups = {g["dead_letter_topic"]: g for g in web.get("/api/groups").json()}
    assert (groups[dlt]["dead_letters"], groups[dlt]["problem"]) == (2, None)
    # the record in the other group's retry topic is read without its headers: its figures stand
    assert (groups[other_dlt]["dead_letters"], groups[other_dlt]["problem"]) == (1, None)
    assert web.get("/").status_code == 200
    # A replay leaves it alone rather than publish it without its headers.
    done = web.post("/api/replay", json={"dlt": dlt, "to": "original", "dry_run": False},
                    headers=AUTH)
    assert done.status_code == 200, done.text
    why = {tuple(s["source"]): s["why"] for s in done.json()["skipped"]}
    assert why[(dlt, 0, 1)].startswith("unreadable headers: its headers cannot be read")


def test_a_json_value_holding_a_lone_surrogate_is_shown_escaped(
        bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k", b'{"name": "\\ud800"}', story("boom"))])
    page = client(bootstrap).get(f"/dead-letters/{dlt}/0/0")
    assert page.status_code == 200
    assert "&#34;name&#34;: &#34;\\ud800&#34;" in page.text or '"name": "\\ud800"' in page.text


def test_a_replay_log_entry_of_the_wrong_shape_is_left_out(bootstrap: str,
                                                           new_topic: NewTopic) -> None:
    dlt = new_topic()
    if REPLAY_LOG not in kafka.topic_partitions(kafka.admin(bootstrap)):
        kafka.create_topics(kafka.admin(bootstrap), {REPLAY_LOG: 1}, config=LOG_CONFIG)

    def entry(at: int, **source: Any) -> kafka.OutRecord:
        value = {"when_ms": at, "who": "test", "destination": {},
                 "source": {"topic": dlt, "partition": 0, "offset": at, **source}}
        return kafka.OutRecord(REPLAY_LOG, json.dumps(value).encode(), f"{dlt}/0/{at}".encode())

    produce_input(bootstrap, [
        entry(0), entry(1, topic=["ab", "cd", "x"]), entry(2, partition="0"),
        entry(3, offset={"x": 1})])
    web = client(bootstrap)
    assert [e["source"]["offset"] for e in web.get("/api/replays", params={"dlt": dlt}).json()
            ] == [0]
    for params in ({"dlt": dlt}, {}):
        page = web.get("/replays", params=params)
        assert page.status_code == 200 and f"{dlt} 0:0" in page.text, params


def test_a_host_the_console_was_not_told_is_refused(bootstrap: str) -> None:
    web = TestClient(create_app(bootstrap, timeout_s=5.0, hosts=LOCAL_HOSTS),
                     base_url="http://127.0.0.1:8765")
    assert web.get("/api/dead-letter-topics").status_code == 200
    assert web.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    rebound = web.get("/api/dead-letter-topics", headers={"Host": "attacker.example:8765"})
    assert rebound.status_code == 400
    assert rebound.text.startswith("Host 'attacker.example' is not one this console answers "
                                   "to (127.0.0.1, localhost, ::1): start it with "
                                   "--allowed-host attacker.example")


def served(monkeypatch: pytest.MonkeyPatch, *args: str,
           env: dict[str, str] | None = None) -> FastAPI:
    """The app `redrive ui` would serve with these arguments."""
    import uvicorn

    apps: list[FastAPI] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: apps.append(app))
    from click.testing import CliRunner

    result = CliRunner().invoke(ui_command, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return apps[0]


def test_redrive_ui_answers_to_its_own_names_and_those_it_is_told(
        bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = served(monkeypatch, "--bootstrap", bootstrap, "--host", "10.1.2.3",
                 "--allowed-host", "console.internal", "--allowed-host", "*.ops.example")
    for name in ["127.0.0.1", "localhost", "10.1.2.3", "console.internal", "a.ops.example"]:
        answer = TestClient(app, base_url=f"http://{name}:8765").get("/api/dead-letter-topics")
        assert answer.status_code == 200, name
    assert TestClient(app, base_url="http://attacker.example").get("/").status_code == 400


def test_redrive_ui_reads_its_token_from_a_file_or_the_environment(
        bootstrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    missing = {"dlt": "no-such.g.dlt", "records": ["0:0"]}
    for args, env in [(["--token-file", str(token_file)], None),
                      ([], {"REDRIVE_UI_TOKEN_FILE": str(token_file)}),
                      ([], {"REDRIVE_UI_TOKEN": TOKEN})]:
        web = TestClient(served(monkeypatch, "--bootstrap", bootstrap, *args, env=env),
                         base_url="http://127.0.0.1")
        assert web.post("/api/replay", json=missing, headers=AUTH).status_code == 404, args
        assert web.post("/api/replay", json=missing,
                        headers={"Authorization": "Bearer wrong"}).status_code == 401
    from click.testing import CliRunner

    both = CliRunner().invoke(ui_command, ["--bootstrap", bootstrap, "--token", TOKEN,
                                           "--token-file", str(token_file)])
    assert both.exit_code == 2 and "give the token once" in both.output
    token_file.write_text("\n")
    empty = CliRunner().invoke(ui_command, ["--bootstrap", bootstrap,
                                            "--token-file", str(token_file)])
    assert empty.exit_code == 2 and "is empty" in empty.output
    absent = CliRunner().invoke(ui_command, ["--bootstrap", bootstrap,
                                             "--token-file", str(tmp_path / "absent")])
    assert absent.exit_code == 2 and "absent cannot be read" in absent.output


def test_a_retry_store_that_is_down_is_named_and_the_groups_still_show(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName, tmp_path: Path) -> None:
    topic, group = new_topic(), unique_name("store-down")
    dlt = new_topic(name=f"{topic}.{group}.dlt")
    produce_records(bootstrap, dlt, [(b"k", b"v", story("boom"))])
    path = tmp_path / "store.db"
    store = RetryStore(str(path))
    try:
        web = client(bootstrap, store=store)
        assert web.get("/api/groups").status_code == 200
        path.unlink()  # the database goes away, as in an outage
        store.engine.dispose()
        groups = web.get("/api/groups")
        assert groups.status_code == 200, groups.text
        row = {g["dead_letter_topic"]: g for g in groups.json()}[dlt]
        assert row["dead_letters"] == 1
        assert [p.split(":")[0] for p in row["elsewhere_problems"]] == [
            "the retry store cannot be read"]
        page = web.get("/")
        assert page.status_code == 200 and dlt in page.text
        assert "Waiting retries: the retry store cannot be read" in page.text
        answer = web.get("/api/store")
        assert answer.status_code == 503
        assert answer.json()["detail"].startswith("the retry store cannot be read")
    finally:
        store.close()


def test_a_page_far_past_the_topic_is_refused(bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k", b"v", story("boom"))])
    web = client(bootstrap)
    for path in [f"/api/dead-letters/{dlt}", f"/dead-letters/{dlt}"]:
        assert web.get(path, params={"page": 1000}).status_code == 200, path
        assert web.get(path, params={"page": 1001}).status_code == 422, path
        assert web.get(path, params={"page": 10**30}).status_code == 422, path


def test_everything_false_on_the_page_reads_only_what_the_page_needs(
        bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k%d" % i, b"v", story("boom")) for i in range(600)])
    assert topic_sizes(bootstrap, dlt)[dlt] == 600
    web = client(bootstrap)
    for value in ["false", "0"]:
        page = web.get(f"/dead-letters/{dlt}", params={"everything": value})
        assert page.status_code == 200 and "among the newest 500 of" in page.text, value
    page = web.get(f"/dead-letters/{dlt}", params={"everything": "1"})
    assert '<span id="total">600</span> record(s)' in page.text
    assert web.get(f"/dead-letters/{dlt}", params={"everything": "maybe"}).status_code == 422


def test_a_cause_link_keeps_the_filters_and_no_page_can_be_framed(
        bootstrap: str, new_topic: NewTopic) -> None:
    dlt = new_topic()
    produce_records(bootstrap, dlt, [(b"k1", b"v", story("boom 1")),
                                     (b"k2", b"v", story("boom 2", reason="deadline"))])
    web = client(bootstrap)
    page = web.get(f"/dead-letters/{dlt}", params={"reason": "deadline", "q": "k2"})
    assert page.status_code == 200
    assert 'href="?reason=deadline&amp;q=k2&amp;fp=app.Boom%3A+boom+%23"' in page.text
    for answer in [page, web.get("/"), web.get(f"/api/dead-letters/{dlt}")]:
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["Content-Security-Policy"] == "frame-ancestors 'none'"


def test_the_last_page_the_console_serves_links_to_no_page_past_it(
        bootstrap: str, new_topic: NewTopic, unique_name: UniqueName,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of a topic read only in part offers the older page, except the last one the
    console serves, whose link answered 422."""
    dlt = new_topic(name=f"{new_topic()}.{unique_name('last')}.dlt")
    produce_records(bootstrap, dlt, [(b"k", b"v", story("boom"))])
    web = client(bootstrap)
    real = Console.view

    def partly_read(self: Console, *args: Any, **kwargs: Any) -> View:
        return replace(real(self, *args, **kwargs), matched=10**6, size=10**6)

    monkeypatch.setattr(Console, "view", partly_read)
    assert "older</a>" in web.get(f"/dead-letters/{dlt}?page={MAX_PAGE - 1}").text
    last = web.get(f"/dead-letters/{dlt}?page={MAX_PAGE}")
    assert last.status_code == 200 and "older</a>" not in last.text


def test_ipv6_loopback_and_a_lone_surrogate_in_a_replays_message(bootstrap: str) -> None:
    web = TestClient(create_app(bootstrap, token=TOKEN, timeout_s=5.0, hosts=LOCAL_HOSTS),
                     base_url="http://[::1]:8765")
    assert web.get("/api/dead-letter-topics").status_code == 200
    # JSON may carry a lone surrogate, escaped; RE2 takes UTF-8, which has no form of it.
    answer = web.post("/api/replay", content=b'{"dlt": "no-such.g.dlt", "message": "\\ud800"}',
                      headers={**AUTH, "Content-Type": "application/json"})
    assert answer.status_code == 400 and "not a regular expression" in answer.text
