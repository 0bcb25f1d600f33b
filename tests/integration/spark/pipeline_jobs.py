"""One pipeline in both forms, for the tests that run it in a process of their own (a cluster's
driver, a driver killed mid-stream): behaviour is spelled in each record's value, `ok`, `bad`
(ParseError, not retryable) or `flaky` (fails its first delivery, then succeeds).

The runner scripts ship this module to executors by value, so they need not import it.
"""

from __future__ import annotations

from typing import Any

from redrive.policy import Backoff, RetryPolicy, error_type
from redrive.spark import RetryPipeline
from redrive.spark.sql import functions

POLICY = RetryPolicy(backoff=Backoff.sequence("1s"), not_retryable=error_type("ParseError"))
FORMS = ("transform", "function")


class ParseError(Exception):
    pass


def handle(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["value"].decode().split(":")[0]
    if kind == "bad":
        raise ParseError("cannot parse")
    if kind == "flaky" and record["attempt"] < 1:
        raise TimeoutError("slow upstream")
    return {"key": record["key"].decode(), "attempt": record["attempt"]}


def transform(frame: Any) -> Any:
    F = functions(frame)
    kind = F.split(F.col("value").cast("string"), ":")[0]

    def error(type_name: str, message: str) -> Any:
        return F.struct(F.lit(type_name).alias("type"), F.lit(message).alias("message"))

    failure = (F.when(kind == "bad", error("ParseError", "cannot parse"))
               .when((kind == "flaky") & (F.col("redrive.attempt") < 1),
                     error("TimeoutError", "slow upstream")))
    return frame.select(F.col("key").cast("string").alias("key"),
                        F.col("redrive.attempt").alias("attempt"), "topic", "partition",
                        "offset", failure.alias("error"))


def pipeline(spark: Any, bootstrap: str, topic: str, group: str, form: str, sink: str,
             checkpoint: str, **options: Any) -> RetryPipeline:
    if form not in FORMS:
        raise ValueError(f"invalid form={form!r}: expected one of {', '.join(FORMS)}")
    shape: dict[str, Any] = ({"transform": transform} if form == "transform" else
                             {"function": handle, "output_schema": "key string, attempt int"})
    return RetryPipeline(spark, bootstrap, topic, group, POLICY, sink=sink,
                         checkpoint=checkpoint, **shape, **options)
