"""The store's tables and the versioned migrations that create and evolve them.

`redrive_schema_version` records every migration applied, in order. Opening a store applies the
missing ones inside one transaction that holds a database-wide lock (an advisory lock on
PostgreSQL, the write lock on SQLite), so schedulers and consumers starting together never race.
A migration's DDL is written out in full in its own function and never changed once released:
the live `retries` table below describes the latest shape, which later migrations reach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    insert,
    select,
    text,
)

from redrive.clock import now_ms
from redrive.errors import RedriveError

PENDING = "pending"
IN_FLIGHT = "in-flight"
PARKED = "parked"  # waiting behind an earlier stored record with the same key (ordering)
SUCCEEDED = "succeeded"
DEAD = "dead"
CANCELLED = "cancelled"
STATUSES = (PENDING, IN_FLIGHT, PARKED, SUCCEEDED, DEAD, CANCELLED)
ACTIVE = (PENDING, IN_FLIGHT, PARKED)
FINAL = (SUCCEEDED, DEAD, CANCELLED)

PAYLOAD = "payload"
REFERENCE = "reference"
MODES = (PAYLOAD, REFERENCE)

# PostgreSQL advisory lock key for migrations: any constant shared by every redrive process.
MIGRATION_LOCK = 0x7265647269766531

# SQLite has no 64-bit autoincrement type: only INTEGER PRIMARY KEY becomes the rowid.
Id = BigInteger().with_variant(Integer(), "sqlite")


class SchemaTooNew(RedriveError):
    """The database was migrated by a newer redrive than this one."""

    def __init__(self, url: str, found: int, known: int) -> None:
        self.found = found
        super().__init__(f"store {url}: schema version {found} is newer than this redrive "
                         f"knows ({known}); upgrade redrive")


metadata = MetaData()

versions = Table(
    "redrive_schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("description", String(200), nullable=False),
    Column("applied_ms", BigInteger, nullable=False),
)


def _retries_columns() -> list[Column[object]]:
    return [
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("group_id", String(255), nullable=False),
        Column("topic", String(255), nullable=False),  # the original topic
        Column("partition", Integer, nullable=False),
        Column("offset", BigInteger, nullable=False),
        Column("timestamp_ms", BigInteger),
        Column("key", LargeBinary),
        # Keys may be long; the ordering index uses their digest, equality checks the key.
        Column("key_digest", String(40)),
        Column("mode", String(16), nullable=False),
        Column("value", LargeBinary),
        Column("headers", Text),  # JSON [[name, base64], ...]; payload mode only
        Column("target", String(255)),  # None: republish to the original topic
        Column("attempt", Integer, nullable=False),
        Column("first_failure_ms", BigInteger),
        Column("due_ms", BigInteger, nullable=False),
        Column("status", String(16), nullable=False),
        Column("reason", String(32)),
        Column("error_type", String(255)),
        Column("error_message", Text),
        Column("error_trace", Text),
        Column("created_ms", BigInteger, nullable=False),
        Column("updated_ms", BigInteger, nullable=False),
        Column("dispatched_ms", BigInteger),
        Column("dispatches", Integer, nullable=False, server_default=text("0")),
        Column("notified_ms", BigInteger),
    ]


def _retries_indexes(table: Table) -> list[Index]:
    c = table.c
    return [
        # "What is due now": only pending rows, in due order.
        Index("redrive_retries_due", c.due_ms, sqlite_where=c.status == PENDING,
              postgresql_where=c.status == PENDING),
        # Per-key ordering: is an earlier record with this key still active?
        Index("redrive_retries_key", c.group_id, c.topic, c.key_digest, c.status),
        # Dead records whose notification has not fired yet.
        Index("redrive_retries_unnotified", c.id,
              sqlite_where=(c.status == DEAD) & c.notified_ms.is_(None),
              postgresql_where=(c.status == DEAD) & c.notified_ms.is_(None)),
        Index("redrive_retries_filter", c.group_id, c.topic, c.status, c.created_ms),
    ]


def _ordered_column() -> Column[bool]:
    # The row's group keeps its key's records in order (StoreBackend(ordering=True)): a requeue
    # of several rows of one key releases them one at a time, as they were first handled.
    return Column("ordered", Boolean, nullable=False, server_default=false())


retries = Table("redrive_retries", metadata, *_retries_columns(), _ordered_column(),
                UniqueConstraint("group_id", "topic", "partition", "offset",
                                 name="redrive_retries_record"))
_retries_indexes(retries)  # Index objects attach themselves to the table's columns


# --- migrations ------------------------------------------------------------------------------


def _v1_retries(conn: Connection) -> None:
    frozen = MetaData()
    table = Table("redrive_retries", frozen, *_retries_columns(),
                  UniqueConstraint("group_id", "topic", "partition", "offset",
                                   name="redrive_retries_record"))
    _retries_indexes(table)
    table.create(conn)  # with the indexes just attached to it


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _v2_ordered(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE redrive_retries ADD COLUMN ordered BOOLEAN NOT NULL "
                      "DEFAULT FALSE"))


def _v3_notifying(conn: Connection) -> None:
    # Claims of notifications (a negative notified_ms) are few and short: the sweep for those a
    # dead scheduler left reads this index, not the table.
    conn.execute(text("CREATE INDEX redrive_retries_notifying ON redrive_retries (notified_ms) "
                      "WHERE notified_ms < 0"))


def _v4_null_header_values(conn: Connection) -> None:
    """Nothing to change in the tables: a row's headers column may now hold a JSON null for a
    header whose value is null, which a redrive before this one takes for a corrupt row. The
    version makes such a redrive refuse the store (SchemaTooNew) rather than kill those rows."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "retries table with due, key, notification and filter indexes", _v1_retries),
    Migration(2, "whether a row's group keeps its key in order", _v2_ordered),
    Migration(3, "dead rows claimed for notification", _v3_notifying),
    Migration(4, "headers may hold null values", _v4_null_header_values),
)
LATEST = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, versions.name):
        return 0
    found = conn.execute(select(versions.c.version).order_by(versions.c.version.desc())
                         .limit(1)).scalar()
    return int(found or 0)


def migrate(conn: Connection, url: str) -> list[int]:
    """Apply the missing migrations in order, in the caller's transaction; return those applied."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    if not conn.dialect.has_table(conn, versions.name):
        versions.create(conn)
    found = current_version(conn)
    if found > LATEST:
        raise SchemaTooNew(url, found, LATEST)
    applied: list[int] = []
    for migration in MIGRATIONS:
        if migration.version <= found:
            continue
        migration.apply(conn)
        conn.execute(insert(versions).values(version=migration.version,
                                             description=migration.description,
                                             applied_ms=now_ms()))
        applied.append(migration.version)
    return applied
