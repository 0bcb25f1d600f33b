"""The source's due gate across a partition restarted at its earliest offset (a topic deleted
and created again, failOnDataLoss=false): planned against a broker double, so that what the gate
scanned is counted."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadAllAvailable

from redrive.spark.options import SourceOptions
from redrive.spark.planning import PartitionKey, Scan
from redrive.spark.source import KafkaStreamReader

TOPIC = "orders.billing.retry.1m"
TP = (TOPIC, 0)
NOT_DUE = 2**62


class Broker:
    """One partition of `latest` records; the first topic's are all due, the second's none."""

    def __init__(self) -> None:
        self.earliest, self.latest, self.recreated = 0, 10, False
        self.scanned: list[tuple[int, int]] = []

    def partitions(self, *, require_all: bool) -> list[PartitionKey]:
        return [TP]

    def list_offsets(self, tps: list[PartitionKey], which: str) -> dict[PartitionKey, int]:
        return {tp: self.latest if which == "latest" else self.earliest for tp in tps}

    def resume_points(self, tps: list[PartitionKey], earliest: dict[PartitionKey, int],
                      latest: dict[PartitionKey, int]) -> dict[PartitionKey, int]:
        return dict(earliest)

    def data_loss(self, tp: PartitionKey, offset: int, earliest: int, latest: int) -> None:
        pass

    def commit_group(self, offsets: object) -> bool:
        return False

    def scan(self, tp: PartitionKey, scan: Scan, stop: int, now_ms: int) -> None:
        self.scanned.append((scan.clear_to, stop))
        if self.recreated:
            scan.held_due = NOT_DUE  # the first record is not due: nothing passes
        else:
            scan.clear_to = stop

    def close(self) -> None:
        pass


def test_records_of_a_partition_restarted_at_its_earliest_offset_are_gated_afresh() -> None:
    """The scan of the records before the restart covered offsets the new records now hold:
    kept, it let them through unscanned, before they were due."""
    options = SourceOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": TOPIC,
                                   "failOnDataLoss": "false"})
    assert options.gated(TOPIC)
    reader = KafkaStreamReader(options)
    broker = Broker()
    reader._broker = broker  # type: ignore[assignment]
    first = reader._latest_offset({TOPIC: {"0": 0}}, ReadAllAvailable())
    assert first == {TOPIC: {"0": 10}}
    assert reader._latest_offset(first, ReadAllAvailable()) == first  # idle
    broker.latest, broker.recreated = 5, True
    restarted = reader._latest_offset(first, ReadAllAvailable())
    assert restarted == {TOPIC: {"0": 0}}  # an empty batch ending at the earliest offset
    broker.scanned.clear()
    after = reader._latest_offset(restarted, ReadAllAvailable())
    assert after == {TOPIC: {"0": 0}}  # none of the new records is due
    assert broker.scanned == [(0, 5)]
