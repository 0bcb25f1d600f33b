"""PySpark integration: the `redrive-kafka` source (Spark's Kafka schema plus the due gate), a
Kafka writer that keeps headers and fails a task unless every record was acknowledged,
RetryPipeline, and for pipelines of their own: retry_stream and route_failures."""

from __future__ import annotations

from redrive.spark.failures import RouteCounts, route_failures
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
    "kafka_schema",
    "register",
    "retry_stream",
    "route_failures",
    "write_to_kafka",
]
