"""A throwaway PostgreSQL server for tests, benchmarks and the demo; never used in production.

It runs the binaries of an installed PostgreSQL (Debian's `postgresql` package keeps them in
/usr/lib/postgresql/<version>/bin): initdb into a temporary dir, then `postgres` on a free port
of the loopback address, with trust authentication. PostgreSQL refuses to run as root, so a root
process runs it as the `postgres` user (which the package creates) and hands it the dir. On Linux
the server gets SIGINT (fast shutdown) if the Python process dies without running its exit
handlers: smart shutdown (SIGTERM) would wait for sessions of the dead process's own children. The
data dir is left behind then.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from redrive.dev.lifetime import tied_to_parent
from redrive.dev.ports import free_port, port_in_use
from redrive.errors import RedriveError

HOST = "127.0.0.1"
SEARCH = "/usr/lib/postgresql"
SERVER_USER = "postgres"


class DevPostgresError(RedriveError):
    """The development PostgreSQL server could not be found or started."""


def bin_dir() -> Path:
    """Where initdb and postgres are: on PATH, or the newest version Debian installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(Path(SEARCH).glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                      else 0)
    if not versions:
        raise DevPostgresError("PostgreSQL is not installed (no initdb on PATH or under "
                               f"{SEARCH}); install Debian's postgresql package "
                               "(make postgres does)")
    return versions[-1].parent


_RUNNING: set[DevPostgres] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


class DevPostgres:
    """One PostgreSQL server in its own temporary dir; stop() removes the dir.

    durable=False turns fsync off: much faster, and enough for tests (the data dir dies anyway).
    """

    def __init__(self, *, durable: bool = True, port: int | None = None) -> None:
        self.bin = bin_dir()
        self.port = port or free_port()
        self.durable = durable
        # Made by start(), removed by stop(): nothing is left behind by a start that fails.
        self.root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._account: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._account = pwd.getpwnam(SERVER_USER)
            except KeyError as exc:
                raise DevPostgresError(f"running as root, and user {SERVER_USER!r} to run "
                                       "PostgreSQL as does not exist") from exc

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        return f"postgresql://{SERVER_USER}@{HOST}:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        result = subprocess.run([str(self.bin / args[0]), *args[1:]], user=self._user(),
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DevPostgresError(f"{args[0]} failed ({result.returncode}): "
                                   f"{(result.stderr or result.stdout).strip()[-2000:]}")

    def _user(self) -> str | None:
        return self._account.pw_name if self._account is not None else None

    def start(self, timeout_s: float = 60.0) -> DevPostgres:
        """initdb and launch; return once the server answering on the port is this one."""
        if self._process is not None:
            raise DevPostgresError(f"postgres on port {self.port} is already running")
        busy = port_in_use(self.port)
        if busy is not None:
            raise DevPostgresError(f"port {self.port} on {HOST} is already in use "
                                   f"({busy.strerror})") from busy
        root = self.root = Path(tempfile.mkdtemp(prefix="redrive-postgres-"))
        _RUNNING.add(self)
        try:
            if self._account is not None:
                os.chown(root, self._account.pw_uid, self._account.pw_gid)
            self._launch(root)
            self._wait_ready(root / "data", time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, root: Path) -> None:
        data = root / "data"
        self._run("initdb", "-D", str(data), "-U", SERVER_USER, "--auth=trust",
                  "--encoding=UTF8", "--no-sync")
        settings = ["-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={root}",
                    "-c", "max_connections=200"]
        if not self.durable:
            settings += ["-c", "fsync=off", "-c", "synchronous_commit=off",
                         "-c", "full_page_writes=off"]
        with (root / "postgres.log").open("wb") as log:
            # setpriv sets the parent-death signal after Popen has switched to the server's user
            # (a switch would clear it). A new session keeps a terminal's Ctrl-C away: stop()
            # ends the server.
            self._process = subprocess.Popen(
                tied_to_parent([str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port),
                                *settings], signal.SIGINT),
                user=self._user(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ready(self, data: Path, deadline: float) -> None:
        import psycopg

        last = ""
        while time.monotonic() < deadline:
            self._raise_if_exited()
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.1)
                continue
            # Another server can take the port between the check and our bind: ours then exits,
            # and the other one answers.
            self._raise_if_exited()
            answering = Path(str(row[0])) if row else None
            if answering is None or answering.resolve() != data.resolve():
                raise DevPostgresError(f"another PostgreSQL server (data directory {answering}) "
                                       f"answers on port {self.port}: {self.log_tail()}")
            return
        raise DevPostgresError(f"postgres on port {self.port} not ready in time: {last}")

    def _raise_if_exited(self) -> None:
        if self._process is None or self._process.poll() is not None:
            raise DevPostgresError(f"postgres exited at start: {self.log_tail()}")

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        database = name or f"redrive_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        return self.database_url(database)

    def log_tail(self, chars: int = 2000) -> str:
        if self.root is None:
            return ""
        path = self.root / "postgres.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, grace_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT: sessions are ended), then remove the dir."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        _RUNNING.discard(self)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> DevPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
