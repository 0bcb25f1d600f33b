"""PySpark integration: the `redrive-kafka` source (Spark's Kafka schema plus the due gate), a
Kafka writer that keeps headers and fails a task unless every record was acknowledged, and
RetryPipeline."""

from __future__ import annotations

from redrive.spark.options import SourceOptionError, SourceOptions, kafka_schema
from redrive.spark.outcomes import PipelineStats
from redrive.spark.pipeline import RetryPipeline
from redrive.spark.planning import DataLoss
from redrive.spark.source import SOURCE_NAME, RedriveKafkaSource, register
from redrive.spark.writer import WriterInputError, write_to_kafka

__all__ = [
    "SOURCE_NAME",
    "DataLoss",
    "PipelineStats",
    "RedriveKafkaSource",
    "RetryPipeline",
    "SourceOptionError",
    "SourceOptions",
    "WriterInputError",
    "kafka_schema",
    "register",
    "write_to_kafka",
]
