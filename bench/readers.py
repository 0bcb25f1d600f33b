"""Whether the librdkafka range reader earns its place: the Spark source's three readers alone.

    python bench/readers.py [--records N] [--runs N] [--json]

Starts noida-db and fills one single-partition topic per compression codec (none, gzip, snappy,
lz4, zstd) with N records of 100 bytes, each with one header. Then reads each whole topic with each
reader the source has, the way a Spark task does (`readers.read_range` into Arrow batches, headers
included), and prints records/s, medians of --runs:
- fetch: redrive.spark._fetchread, Kafka's fetch protocol in C (plaintext, uncompressed only: it
  hands a compressed batch to the next reader, so it is timed on `none` alone);
- native: redrive.spark._rangeread, librdkafka's consumer API in C, with no Python object per
  record: what the source uses for compressed batches and for TLS or SASL connections;
- python: confluent-kafka's consumer and a Python loop building the Arrow columns, what the source
  falls back on where neither C reader is built.
TLS is not measured: no development broker serves it. Both the native and the Python reader reach
it through librdkafka, so the gap between them there is the per-record cost measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

from redrive import kafka
from redrive.dev.brokers import DevBroker
from redrive.spark.options import SourceOptions
from redrive.spark.readers import KafkaRange, read_range

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
READERS = ("fetch", "native", "python")
# noida-db answers a fetch with the whole backlog; librdkafka's default receive limit is below it.
OVERRIDES = {"receive.message.max.bytes": 1_000_000_000}


def fill(bootstrap: str, codec: str, records: int) -> str:
    topic = f"bench-readers-{codec}-{uuid.uuid4().hex[:6]}"
    kafka.create_topics(kafka.admin(bootstrap), {topic: 1})
    producer = kafka.producer(bootstrap, overrides={"compression.type": codec, "linger.ms": 20,
                                                    "batch.size": 1_000_000})
    value = b"x" * 60 + uuid.uuid4().hex.encode()[:8] * 5  # 100 bytes, not all one byte
    for i in range(records):
        kafka.produce(producer, kafka.OutRecord(topic, value, b"k%d" % (i % 1000),
                                                [("redrive-attempt", b"1")]))
    if producer.flush(120) != 0:
        raise SystemExit(f"filling {topic}: records still unconfirmed after 120 s")
    return topic


def rate(bootstrap: str, topic: str, reader: str, records: int) -> float:
    options = SourceOptions.parse({
        "kafka.bootstrap.servers": bootstrap, "subscribe": topic, "redrive.reader": reader,
        "includeHeaders": "true", **{f"kafka.{k}": str(v) for k, v in OVERRIDES.items()}})
    started = time.perf_counter()
    seen = sum(batch.num_rows for batch in read_range(options, KafkaRange(topic, 0, 0, records)))
    took = time.perf_counter() - started
    if seen != records:
        raise SystemExit(f"{reader} read {seen} of {records} records of {topic}")
    return records / took


def measure(bootstrap: str, records: int, runs: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"records": records, "runs": runs, "records_per_s": {}}
    for codec in CODECS:
        topic = fill(bootstrap, codec, records)
        rates = {}
        for reader in READERS if codec == "none" else READERS[1:]:
            rate(bootstrap, topic, reader, records)  # warm-up: connections, caches
            rates[reader] = statistics.median(rate(bootstrap, topic, reader, records)
                                              for _ in range(runs))
        figures["records_per_s"][codec] = rates
        figures.setdefault("native_vs_python", {})[codec] = rates["native"] / rates["python"]
        kafka.delete_topics(kafka.admin(bootstrap), [topic])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    broker = DevBroker("noida-db").start(timeout_s=60.0)
    try:
        figures = measure(broker.bootstrap, args.records, args.runs)
    finally:
        broker.close()
    print(f"{args.records:,} records of 100 bytes with one header, one partition, noida-db; "
          f"records/s, median of {args.runs}")
    print(f"{'codec':<8}" + "".join(f"{reader:>12}" for reader in READERS)
          + f"{'native/python':>15}")
    for codec, rates in figures["records_per_s"].items():
        print(f"{codec:<8}" + "".join(f"{rates[r]:>12,.0f}" if r in rates else f"{'-':>12}"
                                      for r in READERS)
              + f"{figures['native_vs_python'][codec]:>15.2f}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
