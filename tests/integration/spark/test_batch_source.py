"""The source's batch reads (spark.read), planned on the driver without Spark jobs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from redrive import kafka
from redrive.spark.options import SourceOptions
from redrive.spark.readers import KafkaRange
from redrive.spark.source import KafkaBatchReader

from ..records import produce_input

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def produce(bootstrap: str, topic: str, count: int) -> None:
    produce_input(bootstrap,
                  [kafka.OutRecord(topic, b"v%d" % i) for i in range(count)])


def spans(ranges: list[KafkaRange]) -> dict[str, tuple[int, int]]:
    assert all(r.partition == 0 for r in ranges)
    return {r.topic: (r.start, r.end) for r in ranges}


def test_resumed_topics_start_where_the_group_stands(bootstrap: str, new_topic: Any,
                                                     unique_name: Any) -> None:
    main, retry = new_topic(1), new_topic(1)
    produce(bootstrap, main, 4)
    produce(bootstrap, retry, 10)
    group = unique_name("resume")
    committer = kafka.consumer(bootstrap, group)
    try:
        committer.commit(offsets=[TopicPartition(retry, 0, 7)], asynchronous=False)
    finally:
        committer.close()
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": f"{main},{retry}",
               "redrive.group": group, "redrive.resumeTopics": retry}
    ranges = KafkaBatchReader(SourceOptions.parse(options)).partitions()
    assert spans(ranges) == {main: (0, 4), retry: (7, 10)}
    # startingOffsets names the other topics only, as the option's parser requires.
    named = KafkaBatchReader(SourceOptions.parse(
        {**options, "startingOffsets": json.dumps({main: {"0": 2}})})).partitions()
    assert spans(named) == {main: (2, 4), retry: (7, 10)}
