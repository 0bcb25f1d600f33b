"""Pure parts of the store: URLs, header encoding, the headers a republished row carries, what a
notification says, and the checks on backend and consumer settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sqlalchemy import select

from redrive import headers as h
from redrive.consumer import RetryingConsumer
from redrive.errors import InvalidArgument
from redrive.policy import RetryPolicy
from redrive.store import RetryStore, Scheduler, StoreBackend, StoredRetry
from redrive.store.database import StoreUnavailable, database_url
from redrive.store.outcomes import WRITTEN_COLUMNS, entry_row
from redrive.store.rows import (
    FROM_COLUMNS,
    CorruptRow,
    Entry,
    RowFilter,
    decode_headers,
    encode_headers,
    stored_headers,
)
from redrive.store.scheduler import _fields
from redrive.store.schema import PENDING, retries
from redrive.store.webhook import describe


def row(**overrides: object) -> StoredRetry:
    fields: dict[str, object] = dict(
        id=7, group="billing", topic="orders", partition=2, offset=41, timestamp_ms=1000,
        key=b"k", mode="payload", value=b"v", headers=[], target=None, attempt=2,
        first_failure_ms=500, due_ms=9000, status="dead", reason="exhausted",
        error_type="app.Down", error_message="down", error_trace="tb", created_ms=600,
        updated_ms=9500, dispatched_ms=None, dispatches=1)
    fields.update(overrides)
    return StoredRetry(**fields)  # type: ignore[arg-type]


def test_urls_paths_and_drivers(tmp_path: Path) -> None:
    assert database_url(str(tmp_path / "a" / "s.db")) == f"sqlite:///{tmp_path}/a/s.db"
    assert (tmp_path / "a").is_dir()
    assert database_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert database_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert database_url("sqlite:///x.db") == "sqlite:///x.db"
    # A tool that only looks at a store: a mistyped path is an error, and nothing is made.
    with pytest.raises(StoreUnavailable, match=r"b/s.db: no such file"):
        database_url(str(tmp_path / "b" / "s.db"), create=False)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("url", [":memory:", "sqlite://", "sqlite:///:memory:",
                                 "file::memory:?cache=shared"])
def test_an_in_memory_database_is_refused_and_no_file_is_made(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's name for a database that lives in memory: the retries would go with the process.
    It used to make a file named `:memory:` in the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgument, match=r"url=.*: an in-memory SQLite database"):
        RetryStore(url)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_database_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a database")
    with pytest.raises(StoreUnavailable, match=r"notes.txt: file is not a database"):
        RetryStore(tmp_path / "notes.txt")


def test_headers_survive_encoding_byte_for_byte() -> None:
    headers = [("a", b"\x00\xff"), ("a", b""), ("b", "é".encode())]
    assert decode_headers(encode_headers(headers)) == headers
    assert decode_headers(None) == []


@pytest.mark.parametrize("raw", [
    "not json", '{"a": "AA=="}', '[["a"]]', '[["a", "AA==", "x"]]', '[[1, "AA=="]]',
    '[["a", 5]]', '[["a", "A"]]', '"AA=="'])
def test_a_headers_column_that_is_not_what_redrive_writes_is_named(raw: str) -> None:
    with pytest.raises(ValueError, match=r"not a JSON list of \[name, base64 value\] pairs"):
        decode_headers(raw)


def test_a_row_whose_headers_cannot_be_read_is_listed_without_them(tmp_path: Path) -> None:
    store = RetryStore(tmp_path / "corrupt.db")
    store.write([Entry(group="g", topic="orders", partition=0, offset=o, timestamp_ms=5,
                       key=None, mode="payload", value=b"v%d" % o, headers=[("a", b"1")],
                       target=None, attempt=1, first_failure_ms=6, due_ms=10, status=PENDING)
                 for o in range(2)], [])
    with store._begin() as conn:
        conn.execute(retries.update().where(retries.c.offset == 1).values(headers="[[oops"))
        whole = conn.execute(select(retries).where(retries.c.offset == 1)).one()
    with pytest.raises(CorruptRow, match=r"stored retry \d+: invalid headers='\[\[oops'") as caught:
        StoredRetry.of(whole)
    assert (caught.value.row.offset, caught.value.row.value, caught.value.row.headers) == \
        (1, b"v1", [])
    listed = {r.offset: r.headers for r in store.find()}
    assert listed == {0: [("a", b"1")], 1: []}
    store.close()


def test_a_republished_row_carries_its_whole_history() -> None:
    fields = _fields(row())
    headers = h.replace([("trace-id", b"x"), (h.REASON, b"exhausted")], fields)
    delivery = h.read_delivery(headers)
    assert (delivery.attempt, delivery.group, delivery.due_ms, delivery.first_failure_ms) == \
        (2, "billing", 9000, 500)
    assert delivery.original is not None and delivery.original.offset == 41
    assert h.last(headers, h.REASON) is None and h.last(headers, "trace-id") == b"x"
    assert h.last(headers, h.ERROR_TYPE) == b"app.Down"
    # A parked record never failed: it carries no error.
    parked = h.replace([], _fields(row(attempt=0, error_type=None, error_message=None,
                                       error_trace=None, first_failure_ms=None)))
    assert h.last(parked, h.ERROR_TYPE) is None and h.last(parked, h.ATTEMPT) == b"0"


def test_a_row_stores_only_the_headers_its_columns_do_not_give() -> None:
    assert set(_fields(row())) == FROM_COLUMNS  # each written anew when republished
    routed = [("trace-id", b"x"), (h.ERROR_TRACE, b"tb" * 500), (h.ATTEMPT, b"2"),
              ("redrive-custom", b"kept"), ("trace-id", b"y")]
    assert stored_headers(routed) == [("trace-id", b"x"), ("redrive-custom", b"kept"),
                                      ("trace-id", b"y")]
    # Republished, the copy is the same as from the headers routing wrote.
    assert h.replace(stored_headers(routed), _fields(row())) == h.replace(routed, _fields(row()))


def test_a_notification_names_the_record_without_its_value() -> None:
    body = describe(row())
    assert body["key"] == "aw==" and "value" not in body
    assert (body["group"], body["topic"], body["offset"], body["reason"]) == \
        ("billing", "orders", 41, "exhausted")


def test_filters_know_whether_they_narrow() -> None:
    assert not RowFilter().narrows
    assert RowFilter(older_than_ms=0).narrows and RowFilter(ids=(1,)).narrows
    with pytest.raises(InvalidArgument, match="invalid older_than_ms=-1"):
        RowFilter(older_than_ms=-1)


def test_backend_and_consumer_settings_are_checked(tmp_path: Path) -> None:
    store = RetryStore(tmp_path / "s.db")
    with pytest.raises(InvalidArgument, match="invalid mode='copy'"):
        StoreBackend(store, mode="copy")
    with pytest.raises(InvalidArgument, match="invalid inbox='no spaces'"):
        StoreBackend(store, inbox="no spaces")
    with pytest.raises(InvalidArgument, match=r"invalid policies\['orders'\]=3"):
        StoreBackend(store, policies={"orders": 3})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match=r"invalid store='x\.db'"):
        StoreBackend("x.db")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="invalid transactional=True"):
        RetryingConsumer("127.0.0.1:1", "orders", "g", RetryPolicy(), print,
                         transactional=True, retry_backend=StoreBackend(store))
    with pytest.raises(InvalidArgument, match="invalid retry_backend='topics'"):
        RetryingConsumer("127.0.0.1:1", "orders", "g", RetryPolicy(), print,
                         retry_backend="topics")  # type: ignore[arg-type]
    store.close()


def test_the_upsert_writes_every_column_a_row_is_built_with() -> None:
    # The upsert's SQL names its columns itself (the driver takes the rows' dicts as they are):
    # a column entry_row gained but the SQL lacks would be dropped without a word.
    entry = Entry(group="g", topic="orders", partition=0, offset=1, timestamp_ms=5, key=b"k",
                  mode="payload", value=b"v", headers=[], target=None, attempt=1,
                  first_failure_ms=5, due_ms=10, status=PENDING, reason=None, error_type="E",
                  error_message="m", error_trace="t")
    assert sorted(entry_row(entry, 7)) == sorted(WRITTEN_COLUMNS)
    assert set(WRITTEN_COLUMNS) <= {column.name for column in retries.columns}


def test_a_stored_retry_is_read_from_its_row_by_position(tmp_path: Path) -> None:
    store = RetryStore(tmp_path / "rows.db")
    entry = Entry(group="g", topic="orders", partition=3, offset=41, timestamp_ms=5, key=b"k",
                  mode="payload", value=b"v", headers=[("trace", b"\x00\xff")], target="t2",
                  attempt=2, first_failure_ms=6, due_ms=10, status=PENDING, reason=None,
                  error_type="E", error_message="m", error_trace="t")
    store.write([entry], [])
    with store._begin() as conn:
        whole = conn.execute(select(retries)).one()
        part = conn.execute(select(retries.c.id, retries.c.topic)).one()
    built = StoredRetry.of(whole)
    by_name = whole._mapping
    for field in dataclasses.fields(StoredRetry):
        column = "group_id" if field.name == "group" else field.name
        expected = by_name[column] if field.name != "headers" else [("trace", b"\x00\xff")]
        assert getattr(built, field.name) == expected, field.name
    # Built without its __init__, it is still the frozen dataclass a hook may compare or copy.
    assert built == dataclasses.replace(built) == StoredRetry(
        **{f.name: getattr(built, f.name) for f in dataclasses.fields(StoredRetry)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempt = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"whole row of 'redrive_retries'.*not 2"):
        StoredRetry.of(part)
    store.close()


@pytest.mark.parametrize(("field", "value"), [
    ("timeout_s", 0), ("timeout_s", float("inf")), ("idle_s", float("inf")), ("lease_s", -1),
    ("metrics", "prometheus"), ("webhook", 5), ("on_dead", print),
    ("producer_config", "linger.ms=5")])
def test_a_scheduler_refuses_a_bad_argument_naming_it(tmp_path: Path, field: str,
                                                      value: object) -> None:
    store = RetryStore(str(tmp_path / "store.db"))
    try:
        with pytest.raises(InvalidArgument) as caught:
            Scheduler(store, "127.0.0.1:9", **{field: value})  # type: ignore[arg-type]
        assert caught.value.field == field and caught.value.value == value
    finally:
        store.close()


def test_a_url_with_a_port_that_is_not_a_number_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument, match=r"invalid url='postgresql://u@h:port/db'"):
        RetryStore("postgresql://u@h:port/db")


def test_an_error_type_selects_by_its_name_not_as_a_pattern(tmp_path: Path) -> None:
    # `_` and `%` were LIKE's wildcards: a purge by `Read_Error` also deleted `app.ReadXError`.
    store = RetryStore(tmp_path / "types.db")
    types = ["app.Read_Error", "app.ReadXError", "other.ValueError", "app.50%Error"]
    store.write([Entry(group="g", topic="orders", partition=0, offset=o, timestamp_ms=5,
                       key=None, mode="payload", value=b"v", headers=[], target=None, attempt=1,
                       first_failure_ms=6, due_ms=10, status=PENDING, error_type=kind)
                 for o, kind in enumerate(types)], [])
    for wanted, found in [("Read_Error", ["app.Read_Error"]), ("%Error", []),
                          ("50%Error", ["app.50%Error"]), ("app.ReadXError", ["app.ReadXError"])]:
        assert [r.error_type for r in store.find(RowFilter(error_type=wanted))] == found, wanted
    store.close()


def test_a_write_postgresql_aborts_to_break_a_deadlock_is_run_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler's marks and a runtime's outcomes can lock the same rows in opposite orders;
    the aborted side's batch was handled again (a runtime) or its marks left waiting."""
    import psycopg.errors
    from sqlalchemy.exc import OperationalError

    from redrive.store import outcomes

    store = RetryStore(tmp_path / "deadlock.db")
    write = outcomes.Outcomes.write
    aborted: list[int] = []

    def deadlocked_first(self: outcomes.Outcomes, conn: object, dialect: str) -> None:
        if len(aborted) < 2:
            aborted.append(1)
            raise OperationalError("UPDATE retries ...", {}, psycopg.errors.DeadlockDetected(
                "deadlock detected"))
        write(self, conn, dialect)  # type: ignore[arg-type]

    monkeypatch.setattr(outcomes.Outcomes, "write", deadlocked_first)
    store.write([Entry(group="g", topic="orders", partition=0, offset=0, timestamp_ms=5,
                       key=None, mode="payload", value=b"v", headers=[], target=None, attempt=1,
                       first_failure_ms=6, due_ms=10, status=PENDING)], [])
    assert len(aborted) == 2 and [r.offset for r in store.find()] == [0]
    # Anything else the database says is not tried again.
    def gone(self: outcomes.Outcomes, conn: object, dialect: str) -> None:
        aborted.append(1)
        raise OperationalError("UPDATE", {}, Exception("server closed the connection"))

    monkeypatch.setattr(outcomes.Outcomes, "write", gone)
    with pytest.raises(StoreUnavailable, match="server closed the connection"):
        store.write([], [])
    assert len(aborted) == 3
    store.close()
