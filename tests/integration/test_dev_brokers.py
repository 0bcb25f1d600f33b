"""The development brokers (redrive.dev.brokers), against real brokers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from redrive import kafka
from redrive.dev import brokers, lifetime
from redrive.dev.brokers import DevBroker, DevBrokerError, binary_path
from redrive.errors import BrokerUnavailable

pytestmark = pytest.mark.integration

# noida-db acknowledges a record before it writes it to its data dir, about once a second:
# records acknowledged less than ~1 s before a SIGKILL are lost (real Kafka keeps them in the
# page cache). A crash test waits this long after its last write before killing the broker.
NOIDA_FLUSH_WAIT_S = 1.5

HEADERS: list[tuple[str, bytes]] = [
    ("trace-id", b"4bf92f3577b34da6"),
    ("blob", b"\xff\x00\xfe\x80 not utf-8"),
    ("trace-id", b"repeated names keep their order"),
    ("empty", b""),
]


def read_records(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[Message]:
    """Every partition of `topic` from the beginning, until `count` records arrived."""
    consumer = kafka.consumer(bootstrap)
    partitions = kafka.partition_count(kafka.admin(bootstrap), topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append(message)
    finally:
        consumer.close()
    assert len(received) == count, f"read {len(received)} of {count} records from {topic}"
    return received


# (partition, offset) -> (key, value, headers)
Contents = dict[tuple[object, object], tuple[object, ...]]


def as_tuples(messages: Sequence[Message]) -> Contents:
    return {(m.partition(), m.offset()): (m.key(), m.value(), m.headers()) for m in messages}


def expected_tuples(delivered: Sequence[kafka.Delivered],
                    records: Sequence[kafka.OutRecord]) -> Contents:
    return {(d.partition, d.offset): (r.key, r.value, list(r.headers))
            for d, r in zip(delivered, records, strict=True)}


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return False


def process_alive(pid: int) -> bool:
    """False for a zombie too: an orphan's zombie lasts until init gets round to reaping it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # without /proc, os.kill is all there is
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- the development brokers ------------------------------------------------------------------


def produce_and_commit(bootstrap: str, topic: str, group: str) -> tuple[
        list[kafka.OutRecord], list[kafka.Delivered]]:
    kafka.create_topics(kafka.admin(bootstrap), {topic: 2})
    records = [kafka.OutRecord(topic, f"v{i}".encode(), f"k{i}".encode(),
                               [*HEADERS, ("seq", str(i).encode())], partition=i % 2)
               for i in range(10)]
    delivered = kafka.produce_confirmed(kafka.producer(bootstrap), records)
    committer = kafka.consumer(bootstrap, group)
    committer.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)],
                     asynchronous=False)
    committer.close()
    return records, delivered


def assert_kept(bootstrap: str, topic: str, group: str, records: list[kafka.OutRecord],
                delivered: list[kafka.Delivered]) -> None:
    assert as_tuples(read_records(bootstrap, topic, len(records))) == expected_tuples(delivered,
                                                                                     records)
    reader = kafka.consumer(bootstrap, group)
    committed = reader.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    reader.close()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 3), (1, 5)]
    more = kafka.produce_confirmed(kafka.producer(bootstrap),
                                   [kafka.OutRecord(topic, b"after", partition=0)])
    assert [(d.partition, d.offset) for d in more] == [(0, 5)]


def test_noida_restart_on_the_same_data_dir_keeps_records_and_committed_offsets(
        tmp_path: Path) -> None:
    with DevBroker("noida-db", data_dir=tmp_path) as dev:
        records, delivered = produce_and_commit(dev.bootstrap, "kept", "kept-group")
        first_pid = dev.pid
        dev.restart()
        assert dev.pid != first_pid and first_pid is not None and process_gone(first_pid)
        assert_kept(dev.bootstrap, "kept", "kept-group", records, delivered)


def test_noida_killed_and_started_again_keeps_what_it_had_flushed(tmp_path: Path) -> None:
    with DevBroker("noida-db", data_dir=tmp_path) as dev:
        records, delivered = produce_and_commit(dev.bootstrap, "crashed", "crash-group")
        time.sleep(NOIDA_FLUSH_WAIT_S)
        killed_pid = dev.pid
        dev.kill()
        assert not dev.running and killed_pid is not None and process_gone(killed_pid)
        dev.start()
        assert_kept(dev.bootstrap, "crashed", "crash-group", records, delivered)


def test_dev_broker_on_a_port_in_use_fails_naming_the_port(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        dev = DevBroker("noida-db", port=port, data_dir=tmp_path)
        with pytest.raises(DevBrokerError, match=f"port {port} on 127.0.0.1 is already in use"):
            dev.start(timeout_s=10)
        assert not dev.running and dev.pid is None


def test_dev_broker_with_a_missing_binary_fails_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-noida-db"
    with pytest.raises(DevBrokerError, match=re.escape(f"binary not found at {missing}")):
        DevBroker("noida-db", data_dir=tmp_path, binary=missing).start()


def test_dev_broker_rejects_bad_arguments_naming_field_and_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"invalid kind='kafka': expected one of noida-db, tansu"):
        DevBroker("kafka")
    with pytest.raises(ValueError, match=r"invalid port=70000"):
        DevBroker("tansu", port=70000)
    with pytest.raises(ValueError, match=r"invalid timeout_s=0"):
        DevBroker("tansu", data_dir=tmp_path).start(timeout_s=0)


def test_dev_broker_whose_binary_exits_at_once_fails_with_its_log(tmp_path: Path) -> None:
    failing = tmp_path / "broker-that-fails"
    failing.write_text("#!/bin/sh\necho 'cannot open data dir' >&2\nexit 3\n")
    failing.chmod(0o755)
    dev = DevBroker("noida-db", data_dir=tmp_path, binary=failing)
    with pytest.raises(DevBrokerError) as caught:
        dev.start(timeout_s=10)
    message = str(caught.value)
    assert "exited with code 3" in message
    assert str(failing) in message and "cannot open data dir" in message
    assert not dev.running


# A broker must not outlive the Python process that started it, however that process ends.
ORPHAN_SCRIPT = """
import sys, time
from redrive.dev.brokers import DevBroker
broker = DevBroker("tansu", data_dir=sys.argv[2]).start()
print(broker.pid, flush=True)
if sys.argv[1] == "wait":
    time.sleep(120)
"""


@pytest.mark.parametrize(("ending", "how"), [("exit", None), ("wait", signal.SIGKILL),
                                             ("wait", signal.SIGTERM)])
def test_no_broker_outlives_its_python_process(ending: str, how: signal.Signals | None,
                                               tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, ending, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        if how is not None:
            parent.send_signal(how)
        parent.wait(30)
        assert process_gone(broker_pid), f"broker pid {broker_pid} outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_module_entry_point_serves_until_sigterm(tmp_path: Path) -> None:
    serving = subprocess.Popen(
        [sys.executable, "-m", "redrive.dev.brokers", "--kind", "tansu", "--port", "0",
         "--data-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert serving.stdout is not None
        banner = serving.stdout.readline()
        address = serving.stdout.readline().strip().removeprefix("bootstrap.servers=")
        broker_pid = int(banner.split("(pid ")[1].split(",")[0])
        kafka.check_reachable(address)
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(30) == 0
        assert process_gone(broker_pid)
        with pytest.raises(BrokerUnavailable):
            kafka.check_reachable(address, timeout_s=1)
    finally:
        serving.kill()
        serving.wait()


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}")
    path.chmod(0o755)
    return path


def read_pid(path: Path, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"no pid in {path} after {timeout_s}s")


def kill_if_alive(pid: int) -> None:
    if process_alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_stop_ends_the_brokers_a_wrapper_script_started(tmp_path: Path) -> None:
    real = binary_path("tansu")
    pid_file = tmp_path / "broker.pid"
    wrapper = script(tmp_path / "tansu-wrapper", f'"{real}" "$@" &\necho $! > {pid_file}\nwait\n')
    dev = DevBroker("tansu", data_dir=tmp_path, binary=wrapper).start()
    broker_pid = read_pid(pid_file)
    try:
        dev.stop()
        assert process_gone(broker_pid), f"the wrapper's broker (pid {broker_pid}) outlived stop()"
        with pytest.raises(BrokerUnavailable):
            kafka.check_reachable(dev.bootstrap, timeout_s=1)
    finally:
        kill_if_alive(broker_pid)


def test_a_start_that_fails_kills_what_the_broker_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    never_ready = script(tmp_path / "never-ready", f"sleep 300 &\necho $! > {pid_file}\n"
                                                   "exec sleep 300\n")
    dev = DevBroker("noida-db", data_dir=tmp_path, binary=never_ready)
    with pytest.raises(DevBrokerError, match="did not become ready"):
        dev.start(timeout_s=1)
    child_pid = read_pid(pid_file)
    try:
        assert process_gone(child_pid), f"the broker's child (pid {child_pid}) outlived kill()"
    finally:
        kill_if_alive(child_pid)


SERVE_SCRIPT = """
import sys
from pathlib import Path
from redrive.dev import brokers, lifetime
brokers.binary_path = lambda kind: Path(sys.argv[1])
brokers.serve("noida-db", None, sys.argv[2], timeout_s=60)
"""


def test_serve_stopped_by_sigterm_while_the_broker_starts_stops_at_once(tmp_path: Path) -> None:
    pid_file = tmp_path / "broker.pid"
    slow = script(tmp_path / "slow-broker", f"echo $$ > {pid_file}\nexec sleep 300\n")
    serving = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT, str(slow), str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    broker_pid = 0
    try:
        broker_pid = read_pid(pid_file)
        time.sleep(0.5)  # inside the ready wait
        serving.send_signal(signal.SIGTERM)
        out, _ = serving.communicate(timeout=10)
        assert serving.returncode == 0
        assert "stopped noida-db before it was ready" in out
        assert process_gone(broker_pid)
    finally:
        serving.kill()
        serving.wait()
        if broker_pid:
            kill_if_alive(broker_pid)


# --- Tansu ------------------------------------------------------------------------------------


def test_tansu_round_trip_keeps_key_value_and_headers(
        tansu: DevBroker, tansu_topic: Callable[..., str]) -> None:
    topic = tansu_topic()
    record = kafka.OutRecord(topic, value=b"\x00payload", key=b"k-1", headers=HEADERS)
    delivered = kafka.produce_confirmed(kafka.producer(tansu.bootstrap), [record])
    assert [(d.partition, d.offset) for d in delivered] == [(0, 0)]
    assert as_tuples(read_records(tansu.bootstrap, topic, 1)) == expected_tuples(delivered,
                                                                                [record])


def test_a_broker_that_crashed_and_was_reaped_is_not_signalled_as_a_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pid, the id of its process group, may be another server's group by the time the
    session stops it."""
    dev = DevBroker("tansu", data_dir=tmp_path).start()
    assert dev.pid is not None
    os.kill(dev.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while dev.running and time.monotonic() < deadline:  # `running` reaps it
        time.sleep(0.05)
    assert not dev.running
    signalled: list[tuple[int, signal.Signals]] = []
    for module in (brokers, lifetime):
        monkeypatch.setattr(module, "signal_group", lambda group, signum: signalled.append(
            (group, signum)))
    dev.stop()
    dev.kill()
    assert signalled == []
    assert dev.pid is None
