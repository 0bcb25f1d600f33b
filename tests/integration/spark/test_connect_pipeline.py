"""RetryPipeline on Spark Connect: its foreachBatch body is pickled to the server and runs there,
and the client learns what each batch did from the batch ledger. All three forms, counted."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

from redrive import headers as h
from redrive import kafka
from redrive.errors import InvalidArgument
from redrive.policy import RetryPolicy, error_type
from redrive.spark import RetryPipeline, route_failures
from redrive.spark.ledger import ROUTING, Entry, ledger_topic
from redrive.spark.sql import SqlTransform
from redrive.store import RetryStore, StoreBackend

from .test_dataframe_form import POLICY, amounts, failure, produce, produce_values, transform
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.integration, pytest.mark.spark]
OUTPUT = "key string, attempt int"


def per_record(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["value"].decode().split(":")[0]
    if kind == "bad":
        raise ValueError("cannot parse")
    if kind == "flaky" and record["attempt"] < 1:
        raise TimeoutError("slow upstream")
    return {"key": record["key"].decode(), "attempt": record["attempt"]}


def per_batch(frame: pd.DataFrame) -> pd.DataFrame:
    kinds = frame["value"].map(lambda value: value.decode().split(":")[0])
    errors = [ValueError("cannot parse") if kind == "bad"
              else TimeoutError("slow upstream") if kind == "flaky" and attempt < 1 else None
              for kind, attempt in zip(kinds, frame["attempt"], strict=True)]
    return pd.DataFrame({"key": frame["key"].map(bytes.decode), "attempt": frame["attempt"],
                         "error": errors})


@pytest.mark.parametrize("form", ["transform", "function", "batch_function"])
def test_pipeline_on_spark_connect(connect_spark: Any, bootstrap: str, new_topic: Any,
                                   unique_name: Any, tmp_path: Path, form: str) -> None:
    topic = new_topic(partitions=2)
    group = unique_name(f"connect-{form}")
    kinds = ["ok"] * 12 + ["bad"] * 2 + ["flaky"] * 4
    produce(bootstrap, topic, kinds)
    sink = str(tmp_path / "out")
    chosen: dict[str, Any] = {"transform": {"transform": transform},
                              "function": {"function": per_record, "output_schema": OUTPUT},
                              "batch_function": {"batch_function": per_batch,
                                                 "output_schema": OUTPUT}}[form]
    policy = POLICY if form == "transform" else type(POLICY)(
        backoff=POLICY.backoff, not_retryable=ValueError)
    pipeline = RetryPipeline(connect_spark, bootstrap, topic, group, policy, sink=sink,
                             checkpoint=str(tmp_path / "cp"),
                             trigger_interval="300 milliseconds", **chosen)
    stats = pipeline.run(until=lambda s: s.finished >= len(kinds), timeout_s=150)

    rows = connect_spark.read.parquet(sink).collect()
    assert len(rows) == len({row["key"] for row in rows}) == 16
    assert Counter(row["attempt"] for row in rows) == {0: 12, 1: 4}
    assert stats.succeeded_by_retries == {0: 12, 1: 4}
    assert stats.retried_by_attempt == {1: 4}
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}
    assert stats.early == 0
    # The body's step times come back through the ledger from the server's Python worker.
    assert {"ledger", "write", "count", "route"} <= set(stats.step_seconds)
    assert pipeline.metrics.value("redrive_batch_step_seconds_count", step="write") \
        == stats.batches
    assert len(read_all(bootstrap, f"{topic}.{group}.dlt")) == 2
    assert len(read_all(bootstrap, f"{topic}.{group}.retry.1s")) == 4


def dead_letter_types(bootstrap: str, topic: str, group: str) -> dict[bytes, bytes | None]:
    """Each dead letter's value, with the error type its headers give."""
    return {m.value(): h.last(kafka.message_headers(m), h.ERROR_TYPE)
            for m in read_all(bootstrap, f"{topic}.{group}.dlt")}


def test_records_the_transform_cannot_compute_are_routed_on_connect(
        connect_spark: Any, bootstrap: str, new_topic: Any, unique_name: Any,
        tmp_path: Path) -> None:
    """On Connect, Spark's errors reach the body as the Connect client's exceptions."""
    topic = new_topic()
    group = unique_name("connect-unfit")
    produce_values(bootstrap, topic, ["1", "abc", "2", "boom"])
    policy = RetryPolicy(not_retryable=error_type("CAST_INVALID_INPUT", ValueError))
    sink = str(tmp_path / "out")
    stats = RetryPipeline(connect_spark, bootstrap, topic, group, policy, transform=amounts,
                          sink=sink, checkpoint=str(tmp_path / "cp"),
                          trigger_interval="300 milliseconds").run(
        until=lambda s: s.finished >= 4, timeout_s=150)

    assert sorted(row["amount"] for row in connect_spark.read.parquet(sink).collect()) == [1, 2]
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}
    assert dead_letter_types(bootstrap, topic, group) == {b"abc": b"CAST_INVALID_INPUT",
                                                          b"boom": b"ValueError"}


def test_route_failures_inside_a_connect_foreach_batch(connect_spark: Any, bootstrap: str,
                                                       new_topic: Any, unique_name: Any,
                                                       tmp_path: Path) -> None:
    from redrive.spark import retry_stream

    topic = new_topic()
    group = unique_name("connect-own")
    produce(bootstrap, topic, ["ok"] * 5 + ["bad"] * 3)
    frame = retry_stream(connect_spark, bootstrap, topic, group, POLICY)
    cp = str(tmp_path / "cp")
    query = (frame.writeStream.foreachBatch(_own_batch(bootstrap, group, cp))
             .option("checkpointLocation", cp).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(read_all(bootstrap, f"{topic}.{group}.dlt")) == 3
    # The batch id took the routing marks in the group's ledger from the server's Python.
    entries = [Entry.decode(m.value()) for m in read_all(bootstrap, ledger_topic(group))]
    assert [(e.batch, e.state, e.report) for e in entries] == [
        (0, ROUTING, {"by": "route_failures", "checkpoint": cp, "query": str(query.id)})]


def _own_batch(bootstrap: str, group: str, checkpoint: str) -> Any:
    def each_batch(batch: Any, batch_id: int) -> None:
        counts = route_failures(batch.withColumn("error", failure(batch)), bootstrap, group,
                                POLICY, batch_id=batch_id, checkpoint=checkpoint)
        assert counts.dead_lettered == batch.where("value LIKE 'bad:%'").count()
    return each_batch


def test_a_store_backend_is_refused_on_connect(connect_spark: Any, bootstrap: str,
                                               tmp_path: Path) -> None:
    store = RetryStore(tmp_path / "store.db")
    with pytest.raises(InvalidArgument, match=r"retry_backend.*classic session"):
        RetryPipeline(connect_spark, bootstrap, "orders", "g", POLICY, transform=transform,
                      sink=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"),
                      retry_backend=StoreBackend(store))


ORDERS_SQL = """
SELECT topic, partition, offset, order.id AS id, order.amount AS amount,
       CASE WHEN order.id IS NULL THEN named_struct('type', 'ParseError', 'message', 'not JSON')
            WHEN order.amount <= 0 THEN named_struct('type', 'ValidationError',
                                                     'message', 'amount ' || order.amount)
       END AS error
FROM (SELECT *, from_json(CAST(value AS STRING), 'id long, amount double') AS order FROM {batch})
"""


@pytest.mark.parametrize("session", ["spark", "connect_spark"])
def test_a_transform_given_as_sql(request: Any, session: str, bootstrap: str, new_topic: Any,
                                  unique_name: Any, tmp_path: Path) -> None:
    spark = request.getfixturevalue(session)
    topic = new_topic(partitions=2)
    group = unique_name("sql")
    values = ['{"id": 1, "amount": 5}', "not json", '{"id": 2, "amount": -1}',
              '{"id": 3, "amount": 7.5}']
    produce_values(bootstrap, topic, values)
    policy = RetryPolicy(not_retryable=error_type("ParseError", "ValidationError"))
    sink = str(tmp_path / "out")
    stats = RetryPipeline(spark, bootstrap, topic, group, policy, transform=ORDERS_SQL,
                          sink=sink, checkpoint=str(tmp_path / "cp"),
                          trigger_interval="300 milliseconds").run(
        until=lambda s: s.finished >= len(values), timeout_s=150)

    assert sorted((row["id"], row["amount"]) for row in spark.read.parquet(sink).collect()) \
        == [(1, 5.0), (3, 7.5)]
    assert stats.dead_lettered_by_reason == {"not-retryable": 2}
    assert dead_letter_types(bootstrap, topic, group) == {
        b"not json": b"ParseError", b'{"id": 2, "amount": -1}': b"ValidationError"}


def test_a_sql_transform_is_checked_before_anything_runs(connect_spark: Any, bootstrap: str,
                                                        new_topic: Any, unique_name: Any,
                                                        tmp_path: Path) -> None:
    topic = new_topic()

    def pipeline(query: str) -> RetryPipeline:
        return RetryPipeline(connect_spark, bootstrap, topic, unique_name("sqlcheck"), POLICY,
                             transform=query, sink=str(tmp_path / "out"),
                             checkpoint=str(tmp_path / unique_name("cp")))

    with pytest.raises(InvalidArgument, match=r"transform=.*reads the admitted batch as \{batch\}"):
        pipeline("SELECT * FROM orders")
    # Spark's own errors at start, before the query: a query it cannot parse, a missing column
    with pytest.raises(Exception, match="PARSE_SYNTAX_ERROR"):
        pipeline("SELEC topic FROM {batch}").start()
    with pytest.raises(InvalidArgument, match=r"error_column=.*'error'.*no such column"):
        pipeline("SELECT topic, partition, offset FROM {batch}").start()
    # braces of its own are doubled, as in str.format
    braces = SqlTransform("SELECT '{{\"id\": 1}}' AS text FROM {batch}")(connect_spark.range(1))
    assert [row["text"] for row in braces.collect()] == ['{"id": 1}']
