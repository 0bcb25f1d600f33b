"""`redrive store ls|show|requeue|cancel|purge` through click's CliRunner, on both databases."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from redrive.cli.store import store_command
from redrive.store import RetryStore, RowFilter
from redrive.store.schema import CANCELLED, DEAD, PARKED, PENDING

from .conftest import entry


def invoke(store: RetryStore, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(store_command, ["--url", store.url, *args])
    return result.exit_code, result.output


def seed(store: RetryStore) -> None:
    store.write([entry("billing", "orders", 1, status=DEAD, reason="exhausted",
                       error_type="app.PaymentDown", key=b"cust-1"),
                 entry("billing", "orders", 2, status=DEAD, reason="not-retryable",
                       error_type="builtins.ValueError"),
                 entry("billing", "refunds", 3, status=DEAD, reason="exhausted"),
                 entry("shipping", "orders", 4, key=b"cust-9"),
                 entry("shipping", "orders", 5, key=b"cust-9", status=PARKED, attempt=0)], [])


def test_ls_and_show_print_tables(store: RetryStore) -> None:
    seed(store)
    code, out = invoke(store, "ls", "--group", "billing", "--status", "dead")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "group", "topic", "partition"]
    assert len(lines[2:lines.index("")]) == 3  # below the header and its rule
    assert "3 row(s): 3 dead" in out
    code, out = invoke(store, "ls", "--error-type", "PaymentDown")
    assert code == 0 and "1 row(s): 1 dead" in out and "cust-1" in out

    row = store.find(RowFilter(topic="orders", group="billing"))[0]
    code, out = invoke(store, "show", str(row.id))
    assert code == 0, out
    assert "orders[0]@1" in out and "app.PaymentDown" in out and "trace-id" in out
    assert "Traceback" in out
    code, out = invoke(store, "show", "999")
    assert code == 1 and "no stored retry with id=999" in out


def test_requeue_and_cancel_from_the_cli(store: RetryStore) -> None:
    seed(store)
    code, out = invoke(store, "requeue", "--group", "billing", "--topic", "orders",
                       "--reset-attempts")
    assert (code, out.strip()) == (0, "requeued 2 row(s)")
    requeued = store.find(RowFilter(group="billing", topic="orders"))
    assert [(r.status, r.attempt, r.reason) for r in requeued] == [(PENDING, 0, None)] * 2
    assert store.get(store.find(RowFilter(topic="refunds"))[0].id).status == DEAD

    code, out = invoke(store, "requeue", "--status", "dead", "--in", "10m")
    assert (code, out.strip()) == (0, "requeued 1 row(s)")
    assert store.find(RowFilter(topic="refunds"))[0].due_ms > requeued[0].due_ms + 500_000

    head = store.find_record("shipping", "orders", 0, 4)
    assert head is not None
    code, out = invoke(store, "cancel", str(head.id))
    assert (code, out.strip()) == (0, "cancelled 1 row(s)")
    statuses = {r.offset: r.status for r in store.find(RowFilter(group="shipping"))}
    assert statuses == {4: CANCELLED, 5: PENDING}  # the parked record moved up

    code, out = invoke(store, "purge", "--group", "shipping")
    assert (code, out.strip()) == (0, "purged 1 row(s)")
    assert store.counts() == {PENDING: 4}


def test_actions_refuse_to_touch_everything_and_name_bad_values(store: RetryStore) -> None:
    seed(store)
    code, out = invoke(store, "cancel")
    assert code == 2 and "name ids or give at least one of --group" in out
    code, out = invoke(store, "ls", "--older-than", "soon")
    assert code == 2 and "invalid --older-than='soon'" in out
    code, out = invoke(store, "ls", "--status", "lost")
    assert code == 2 and "'lost' is not one of" in out
    code, out = invoke(store, "purge", "--status", "pending")
    assert code == 1 and "invalid status='pending'" in out
    code, out = invoke(store, "ls", "--limit", "-1")  # PostgreSQL raised, SQLite listed all
    assert code == 2 and "Invalid value for '--limit'" in out
    code, out = invoke(store, "show", str(2**64))
    assert code == 2 and "Invalid value for 'RETRY_ID'" in out
    code, out = invoke(store, "run", "-b", "127.0.0.1:1", "--lease", "0")  # said lease_s=0.0
    assert code == 2 and "Invalid value for --lease: '0' is not a positive duration" in out
    assert store.counts() == {DEAD: 3, PENDING: 1, PARKED: 1}


def test_a_mistyped_store_path_is_an_error_not_an_empty_store(tmp_path: Path) -> None:
    typo = tmp_path / "no" / "such" / "store.db"
    result = CliRunner().invoke(store_command, ["--url", str(typo), "ls", "--status", "dead"])
    assert result.exit_code == 1
    assert f"retry store {typo}: no such file" in result.output
    assert not (tmp_path / "no").exists()
