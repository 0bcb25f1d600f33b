"""PySpark integration: the `redrive-kafka` source (Spark's Kafka schema plus the due gate), a
Kafka writer that keeps headers and fails a task unless every record was acknowledged,
RetryPipeline, for pipelines of their own retry_stream and route_failures, and a group's dead
letters as a DataFrame (dead_letters). Replaying a selection of that table is an on-call tool,
`redrive.ops.selection.replay_selection`: runtimes never import `redrive.ops`."""

from __future__ import annotations

from redrive.spark.checkpoint import query_id
from redrive.spark.dead_letter_table import dead_letters
from redrive.spark.failures import RouteCounts, route_failures, succeeded
from redrive.spark.options import SourceOptionError, SourceOptions, kafka_schema
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.planning import DataLoss
from redrive.spark.source import SOURCE_NAME, RedriveKafkaSource, register
from redrive.spark.stream import retry_stream
from redrive.spark.writer import WriterInputError, write_to_kafka

__all__ = [
    "SOURCE_NAME",
    "DataLoss",
    "PipelineStats",
    "RedriveKafkaSource",
    "RetryPipeline",
    "RouteCounts",
    "SourceOptionError",
    "SourceOptions",
    "WriterInputError",
    "dead_letters",
    "kafka_schema",
    "query_id",
    "register",
    "retry_stream",
    "route_failures",
    "succeeded",
    "write_to_kafka",
]
