"""The DataFrame form at its edges: a checkpoint path Hadoop would read as a glob, an error
column whose name has a dot, and an error struct whose fields are all null."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from redrive import kafka
from redrive.spark import query_id, route_failures, succeeded
from redrive.spark.sql import functions

from .test_dataframe_form import POLICY, produce
from .test_pipeline import read_all

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def batch_of(spark: Any, bootstrap: str, topic: str) -> Any:
    return spark.read.format("redrive-kafka").options(
        **{"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "includeHeaders": "true",
           "redrive.decodeHeaders": "true", "startingOffsets": "earliest",
           "endingOffsets": "latest"}).load()


def error_when_bad(frame: Any, *, typed: bool = True) -> Any:
    """An error struct built field by field: its fields are null, not the struct, where the
    record is good."""
    F = functions(frame)
    bad = F.split(F.col("value").cast("string"), ":")[0] == "bad"
    kind = F.lit("ParseError") if typed else F.lit(None).cast("string")
    return F.struct(F.when(bad, kind).alias("type"),
                    F.when(bad, F.lit("cannot parse")).alias("message"))


def test_a_checkpoint_path_with_glob_characters_names_its_own_query(
        spark: Any, tmp_path: Path) -> None:
    for name, query in (("cp1", "another-query"), ("cp[1]", "this-query"),
                        ("cp{a,b}*?", "a-third-query")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metadata").write_text(json.dumps({"id": query}) + "\n")
    assert query_id(spark, str(tmp_path / "cp[1]")) == "this-query"
    assert query_id(spark, str(tmp_path / "cp{a,b}*?")) == "a-third-query"


def test_an_error_column_whose_name_has_a_dot(spark: Any, bootstrap: str, new_topic: Any,
                                              unique_name: Any) -> None:
    topic = new_topic()
    group = unique_name("dotted")
    produce(bootstrap, topic, ["ok"] * 3 + ["bad"] * 2)
    batch = batch_of(spark, bootstrap, topic)
    counts = route_failures(batch.withColumn("the.error", error_when_bad(batch)), bootstrap,
                            group, POLICY, error_column="the.error")
    assert (counts.total, counts.dead_lettered) == (2, 2)
    assert len(read_all(bootstrap, f"{topic}.{group}.dlt")) == 2


def test_an_error_struct_whose_fields_are_all_null_is_a_success(
        spark: Any, bootstrap: str, new_topic: Any, unique_name: Any) -> None:
    topic = new_topic()
    group = unique_name("null-fields")
    sent = produce(bootstrap, topic, ["ok"] * 4 + ["bad"] * 2)
    batch = batch_of(spark, bootstrap, topic)
    checked = batch.withColumn("error", error_when_bad(batch))
    counts = route_failures(checked, bootstrap, group, POLICY)
    assert (counts.total, counts.dead_lettered) == (2, 2)
    assert {r.reason for r in counts} == {"not-retryable"}
    # what a sink of the user's own gets: every row route_failures copied nowhere
    written = checked.where(succeeded(checked)).select("key").collect()
    assert sorted(bytes(row["key"]).decode() for row in written) == sorted(
        key for key, kind in sent.items() if kind == "ok")
    dead = read_all(bootstrap, f"{topic}.{group}.dlt")
    assert sorted(m.key().decode() for m in dead) == sorted(
        key for key, kind in sent.items() if kind == "bad")
    # a failure with a message and no type still fails, as malformed
    other = unique_name("untyped")
    counts = route_failures(batch.withColumn("error", error_when_bad(batch, typed=False)),
                            bootstrap, other, POLICY)
    assert [(r.reason, r.n) for r in counts] == [("malformed", 2)]
    assert kafka.topic_partitions(kafka.admin(bootstrap)).get(f"{topic}.{other}.dlt") == 1
