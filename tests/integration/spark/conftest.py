"""One SparkSession for the whole test session, with the redrive-kafka source registered.

Starting Spark costs 10-20 s and its first job as much again on this class of machine, so every
Spark test shares this session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from redrive import kafka
from redrive.spark import register


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # Workers must run this interpreter, or they start a system Python without pyarrow.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("redrive-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def produce_transactions(bootstrap: str, topic: str, transactional_id: str,
                         transactions: list[tuple[list[str], bool]]) -> None:
    """Produce each (values, commit) as one transaction, committed or aborted."""
    producer = kafka.producer(bootstrap, transactional_id=transactional_id)
    producer.init_transactions()
    for values, commit in transactions:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value.encode())
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
