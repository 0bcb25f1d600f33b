"""The redrive-kafka source through Spark Connect: a client session of a local Connect server.

The source's classes reach the server pickled by reference, so the server's Python (this
interpreter, redrive.dev.spark sets PYSPARK_PYTHON) imports them from the installed redrive.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from redrive.dev.ports import HOST, free_port

from .test_spark_source import batch_read, produce, stream

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_session_is_a_connect_client(connect_spark: Any, connect_server: Any) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert isinstance(connect_spark, ConnectSession)
    assert connect_spark.conf.get("spark.connect.grpc.binding.port") == str(connect_server.port)
    assert connect_spark.conf.get("spark.master") == "local[2]"
    # Built with the Connect builder, it leaves the process's classic sessions classic.
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def test_batch_read(connect_spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(2)
    produce(bootstrap, topic, 30, partition=0)
    produce(bootstrap, topic, 20, partition=1, start=100)
    frame = batch_read(connect_spark, bootstrap, topic)
    assert frame.count() == 50
    rows = frame.collect()
    assert sorted((r["partition"], r["offset"]) for r in rows) == (
        [(0, o) for o in range(30)] + [(1, o) for o in range(20)])
    for row in rows:
        n = row["offset"] + (100 if row["partition"] == 1 else 0)
        assert (bytes(row["key"]), bytes(row["value"])) == (f"k{n}".encode(), f"v{n}".encode())
        assert row["topic"] == topic
    ending = json.dumps({topic: {"0": 10, "1": 5}})
    assert batch_read(connect_spark, bootstrap, topic, endingOffsets=ending).count() == 15


def test_batch_read_of_an_empty_topic_has_no_rows(connect_spark: Any, bootstrap: str,
                                                 new_topic: Any) -> None:
    topic = new_topic(3)
    frame = batch_read(connect_spark, bootstrap, topic)
    assert frame.count() == 0
    assert frame.collect() == []


def test_streaming_read_into_a_memory_sink(connect_spark: Any, bootstrap: str, new_topic: Any,
                                          tmp_path: Path) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, 300)
    name = f"connect_stream_{uuid.uuid4().hex[:8]}"
    query = (stream(connect_spark, bootstrap, topic, startingOffsets="earliest",
                    maxOffsetsPerTrigger="120")
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert not query.isActive, "availableNow query did not finish"
        assert query.exception() is None
        sizes = [p.numInputRows for p in query.recentProgress if p.numInputRows]
    finally:
        query.stop()
    assert sizes == [120, 120, 60]
    counted = connect_spark.sql(
        f"SELECT count(*) AS n, count(DISTINCT partition, offset) AS d FROM {name}").collect()
    assert (counted[0]["n"], counted[0]["d"]) == (300, 300)
    values = [bytes(r["value"]).decode() for r in connect_spark.table(name).collect()]
    assert sorted(values) == sorted(f"v{i}" for i in range(300))


# The client warns as it gives up retrying, before the error the test expects.
@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED:UserWarning")
def test_an_unreachable_server_is_named_in_the_error() -> None:
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    address = f"{HOST}:{free_port()}"
    session = ConnectSession.builder.remote(f"sc://{address}").create()
    # By default the client retries an unavailable server for about 10 minutes.
    session.client.set_retry_policies([DefaultPolicy(max_retries=2, max_backoff=200)])
    session.release_session_on_close = False
    try:
        with pytest.raises(SparkConnectGrpcException, match=re.escape(address)):
            session.range(3).collect()
    finally:
        session.stop()


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_the_source_is_read_from_sql(request: Any, session: str, bootstrap: str,
                                     new_topic: Any, unique_name: Any) -> None:
    from redrive.spark import register

    spark = request.getfixturevalue(session)
    register(spark)
    topic = new_topic(2)
    produce(bootstrap, topic, 30, partition=0)
    produce(bootstrap, topic, 20, partition=1, start=100)
    view = unique_name("raw").replace("-", "_")
    spark.sql(f"CREATE TEMPORARY VIEW {view} USING `redrive-kafka` OPTIONS "
              f"(`kafka.bootstrap.servers` '{bootstrap}', subscribe '{topic}')")
    rows = spark.sql(f"SELECT partition, count(*), min(offset), max(CAST(value AS STRING)) "
                     f"FROM {view} GROUP BY partition ORDER BY partition").collect()
    assert [tuple(row) for row in rows] == [(0, 30, 0, "v9"), (1, 20, 0, "v119")]
    # a missing option is named, as through the DataFrame reader
    with pytest.raises(Exception, match=re.escape("kafka.bootstrap.servers")):
        spark.sql(f"CREATE TEMPORARY VIEW {view}_bad USING `redrive-kafka` OPTIONS "
                  f"(subscribe '{topic}')")
        spark.sql(f"SELECT count(*) FROM {view}_bad").collect()
