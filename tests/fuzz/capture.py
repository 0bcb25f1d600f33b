"""Writes the fuzz seeds of the fetch reader: Fetch v4 answers captured from noida-db.

    PYTHONPATH=tests python -m fuzz.capture

Starts noida-db, writes records as confluent-kafka writes them (headers, null keys and values, a
transaction committed and one aborted, with their markers), asks for them with the Fetch v4 request
the reader sends, and keeps each answer as it came (size, correlation id 1, body) in `seeds/`,
under both isolation levels and from two offsets.
"""

from __future__ import annotations

import socket
import struct
import tempfile
from pathlib import Path
from typing import cast

from redrive import kafka
from redrive.dev.brokers import DevBroker

SEEDS = Path(__file__).parent / "seeds"
TOPIC = "fuzzed"  # the topic fuzz.fetchread reads


def produce(bootstrap: str) -> None:
    kafka.create_topics(kafka.admin(bootstrap), {TOPIC: 1})
    plain = kafka.producer(bootstrap)
    for i in range(12):
        # A None value is written as a null header value, which the seeds must hold.
        headers = cast(list[tuple[str, bytes]],
                       [("redrive-attempt", str(i % 3).encode()), ("trace", None), ("é", b"\xff")])
        kafka.produce(plain, kafka.OutRecord(TOPIC, None if i % 5 == 0 else b"v%d" % i,
                                             None if i % 4 == 0 else b"k%d" % i,
                                             headers[: i % 4]))
        if i % 6 == 5:
            plain.flush(10)  # several batches
    plain.flush(10)
    for commit in (True, False, True):
        producer = kafka.producer(bootstrap, transactional_id=f"fuzz-seeds-{commit}")
        producer.init_transactions(10)
        producer.begin_transaction()
        for i in range(4):
            kafka.produce(producer, kafka.OutRecord(TOPIC, b"t%d" % i, b"k"))
        producer.flush(10)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)


def fetch(bootstrap: str, offset: int, committed: bool) -> bytes:
    host, port = bootstrap.rsplit(":", 1)
    topic = TOPIC.encode()
    body = (struct.pack(">iiiib", -1, 100, 1, 1 << 20, int(committed)) + struct.pack(">i", 1)
            + struct.pack(">h", len(topic)) + topic + struct.pack(">i", 1)
            + struct.pack(">iqi", 0, offset, 1 << 20))
    client = b"redrive-fuzz"
    request = struct.pack(">hhih", 1, 4, 1, len(client)) + client + body
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(struct.pack(">i", len(request)) + request)
        head = connection.recv(4, socket.MSG_WAITALL)
        (size,) = struct.unpack(">i", head)
        answer = b""
        while len(answer) < size:
            answer += connection.recv(size - len(answer))
    return head + answer


def main() -> None:
    SEEDS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as data:
        broker = DevBroker("noida-db", data_dir=Path(data)).start(timeout_s=60.0)
        try:
            produce(broker.bootstrap)
            for offset in (0, 7):
                for committed in (False, True):
                    name = f"noida-db-from-{offset}-{'committed' if committed else 'all'}.bin"
                    (SEEDS / name).write_bytes(fetch(broker.bootstrap, offset, committed))
                    print(SEEDS / name)
        finally:
            broker.close()


if __name__ == "__main__":
    main()
