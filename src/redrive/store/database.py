"""Opening the store's database: SQLite from a file path, PostgreSQL from a URL.

SQLite gets WAL, FULL sync and transactions begun by hand (BEGIN IMMEDIATE for writers), so
writers queue on the lock instead of failing on a lock upgrade.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from redrive.errors import InvalidArgument, RedriveError

DEFAULT_PATH = Path(".redrive") / "store.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
READ_ONLY = "redrive_read_only"


class StoreUnavailable(RedriveError):
    """The store's database cannot be reached or opened."""

    def __init__(self, url: str, why: str) -> None:
        self.url = url
        super().__init__(f"retry store {url}: {why}")


def database_url(url: str | Path, *, create: bool = True) -> str:
    """The SQLAlchemy URL of a store. A file path is SQLite's: with `create` its folders are
    made, else it must exist (a mistyped path must not read as an empty store)."""
    if str(url).strip() in (":memory:", "sqlite://", "sqlite:///:memory:") \
            or str(url).startswith("file::memory:"):
        raise InvalidArgument("url", str(url), "an in-memory SQLite database: the retries it "
                              "holds would go when the process ends, and no scheduler in "
                              "another process could see them; give a file path")
    if isinstance(url, Path) or "://" not in url:
        path = Path(url).expanduser().resolve()
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.is_file():
            raise StoreUnavailable(str(path), "no such file (a consumer with a StoreBackend, or "
                                   "`redrive store run`, creates the store)")
        return f"sqlite:///{path}"
    # psycopg 3 is the PostgreSQL driver redrive depends on; plain URLs mean it.
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def enable_wal(cursor: Any) -> None:
    """Switch to WAL, waiting out other openers of a new file.

    SQLite answers "database is locked" to a journal-mode change at once, without calling the
    busy handler, while another connection holds the file: retry up to the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"check_same_thread": False,
                                                  "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            # Transactions are begun by hand below, not by the sqlite3 module's own rules.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            enable_wal(cursor)
            # A row written means a record whose offset may be committed: FULL survives
            # power loss, which NORMAL in WAL mode does not.
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # Readers need no lock in WAL mode; the consumer looks rows up once per retry.
            read_only = conn.get_execution_options().get(READ_ONLY, False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    if parsed.get_backend_name() != "postgresql":
        raise InvalidArgument("url", parsed.render_as_string(hide_password=True),
                              "the retry store runs on SQLite (a file path) or PostgreSQL")
    return create_engine(url, pool_pre_ping=True)
