"""Kafka's wire format for the fetch reader's unit tests: record batches (format v2) encoded as the
protocol defines them, and a scripted peer on loopback that answers Metadata v4 and Fetch v4 with
what a test gives it - the answers a real broker sends only in rare states (a batch cut short, an
old message format, log-append times, a moved leader, a dropped connection)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Header = tuple[str | bytes, bytes | None]  # a name as bytes is written as it is


def varint(value: int) -> bytes:
    """Zigzag varint, as record fields are written."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _sized(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(offset_delta: int, value: bytes | None, key: bytes | None = None, *,
           ts_delta: int = 0, headers: Sequence[Header] = ()) -> bytes:
    body = (b"\0" + varint(ts_delta) + varint(offset_delta) + _sized(key) + _sized(value)
            + varint(len(headers))
            + b"".join(_sized(name if isinstance(name, bytes) else name.encode()) + _sized(hv)
                       for name, hv in headers))
    return varint(len(body)) + body


def batch(base_offset: int, records: Sequence[bytes], *, base_ts: int = 1_000,
          max_ts: int | None = None, attributes: int = 0, producer_id: int = -1,
          magic: int = 2, last_delta: int | None = None) -> bytes:
    """A record batch; attributes bit 3 is log-append time, 4 transactional, 5 a marker."""
    last = len(records) - 1 if last_delta is None else last_delta
    after_crc = struct.pack(">hiqqqhii", attributes, last, base_ts,
                            base_ts if max_ts is None else max_ts, producer_id, 0, 0,
                            len(records)) + b"".join(records)
    rest = struct.pack(">ibI", 0, magic, 0) + after_crc
    return struct.pack(">qi", base_offset, len(rest)) + rest


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


@dataclass
class Answer:
    """One fetch answer: records (None for a null field), a partition error, or a connection the
    peer drops after sending `cut` bytes of the answer."""

    records: bytes | None = b""
    error: int = 0
    high_watermark: int = 0
    aborted: Sequence[tuple[int, int]] | None = None
    cut: int | None = None


@dataclass
class Fetch:
    offset: int
    partition_max_bytes: int


@dataclass
class Peer:
    """A scripted broker: `answer(fetch)` gives each fetch's answer; `leader` is the address the
    metadata answer names for the partition (this peer's own when None)."""

    topic: str
    partition: int
    answer: Callable[[Fetch], Answer]
    leader: tuple[str, int] | None = None
    fetches: list[Fetch] = field(default_factory=list)
    metadata_requests: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.address = self._listener.getsockname()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(connection,), daemon=True).start()

    def _talk(self, connection: socket.socket) -> None:
        with connection:
            while True:
                head = connection.recv(4, socket.MSG_WAITALL)
                if len(head) < 4:
                    return
                (size,) = struct.unpack(">i", head)
                request = connection.recv(size, socket.MSG_WAITALL)
                api, _version, correlation, client_len = struct.unpack(">hhih", request[:10])
                body = request[10 + max(client_len, 0):]
                if api == 3:
                    answer, cut = self._metadata(), None
                else:
                    answer, cut = self._fetch(body)
                reply = framed(correlation, answer)
                connection.sendall(reply if cut is None else reply[:cut])
                if cut is not None:
                    return

    def _metadata(self) -> bytes:
        self.metadata_requests += 1
        host, port = self.leader or self.address
        brokers = struct.pack(">i", 1) + struct.pack(">i", 7) + _string(host) \
            + struct.pack(">i", port) + _string(None)
        partition = struct.pack(">hiiii", 0, self.partition, 7, 0, 0)
        topic = struct.pack(">h", 0) + _string(self.topic) + b"\0" + struct.pack(">i", 1) \
            + partition
        return struct.pack(">i", 0) + brokers + _string("cluster") + struct.pack(">i", 7) \
            + struct.pack(">i", 1) + topic

    def _fetch(self, body: bytes) -> tuple[bytes, int | None]:
        # replica, max wait, min bytes, max bytes, isolation; one topic, one partition.
        at = 4 + 4 + 4 + 4 + 1 + 4
        (name_len,) = struct.unpack(">h", body[at:at + 2])
        at += 2 + name_len + 4
        _partition, offset, max_bytes = struct.unpack(">iqi", body[at:at + 16])
        fetch = Fetch(offset, max_bytes)
        self.fetches.append(fetch)
        given = self.answer(fetch)
        return fetch_answer(self.topic, self.partition, given), \
            None if given.cut is None else 8 + given.cut


def fetch_answer(topic: str, partition: int, given: Answer) -> bytes:
    """The body of a Fetch v4 answer for one partition (after the size and correlation id)."""
    if given.aborted is None:
        aborted = struct.pack(">i", -1)
    else:
        aborted = struct.pack(">i", len(given.aborted)) + b"".join(
            struct.pack(">qq", producer, first) for producer, first in given.aborted)
    records = (struct.pack(">i", -1) if given.records is None
               else struct.pack(">i", len(given.records)) + given.records)
    return (struct.pack(">i", 0) + struct.pack(">i", 1) + _string(topic)
            + struct.pack(">i", 1)
            + struct.pack(">ihqq", partition, given.error, given.high_watermark,
                          given.high_watermark)
            + aborted + records)


def framed(correlation: int, body: bytes) -> bytes:
    """An answer as it travels: its size, its correlation id, its body."""
    reply = struct.pack(">i", correlation) + body
    return struct.pack(">i", len(reply)) + reply
