"""Runs redrive-kafka jobs in a classic SparkSession on a standalone cluster, in a process of
its own.

A Python process holds one SparkContext, and the test session's `spark` fixture already holds a
local[2] one; the `cluster_spark` fixture (conftest.py) starts this script once instead:

    python cluster_runner.py spark://127.0.0.1:PORT

It builds the session, then reads jobs from stdin, one JSON object per line, and writes one JSON
line per job to its stdout: first {"app_id", "master"} once the session is up, then each job's
counts, or {"error": ...}. Spark's own output goes to stderr. It stops the session and exits when
stdin closes. Executors import redrive from this interpreter (PYSPARK_PYTHON), where it is
installed.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

SESSION_CONF = {
    "spark.app.name": "redrive-cluster-tests",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.cores.max": "1",
    "spark.executor.memory": "512m",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
}


def summary(rows: list[tuple[int, int, bytes]]) -> dict[str, Any]:
    return {"rows": len(rows), "distinct": len({(p, o) for p, o, _ in rows}),
            "values": sorted(v.decode() for _, _, v in rows)}


def batch(spark: Any, bootstrap: str, topic: str) -> dict[str, Any]:
    frame = (spark.read.format("redrive-kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).load())
    rows = [(r["partition"], r["offset"], bytes(r["value"]))
            for r in frame.select("partition", "offset", "value").collect()]
    return {**summary(rows), "count": frame.count()}


def pipeline(spark: Any, bootstrap: str, topic: str, group: str, form: str, sink: str,
             checkpoint: str, expected: int) -> dict[str, Any]:
    import pipeline_jobs

    stats = pipeline_jobs.pipeline(
        spark, bootstrap, topic, group, form, sink, checkpoint,
        trigger_interval="500 milliseconds",
    ).run(until=lambda s: s.finished >= expected, timeout_s=240)
    rows = spark.read.parquet(sink).select("key", "attempt").collect()
    return {"keys": sorted(row["key"] for row in rows),
            "attempts": sorted(row["attempt"] for row in rows),
            "succeeded_by_retries": {str(k): v for k, v in stats.succeeded_by_retries.items()},
            "dead_lettered_by_reason": stats.dead_lettered_by_reason,
            "early": stats.early, "finished": stats.finished}


def route_with_task_retries(spark: Any, bootstrap: str, topic: str, group: str,
                            checkpoint: str) -> dict[str, Any]:
    """route_failures over a topic's records, all failed, with a producer that refuses the
    last as too large: the task fails after the others were copied, and Spark runs it again
    (a cluster's spark.task.maxFailures is 4) until the job fails."""
    import pipeline_jobs
    from pyspark.sql import functions as F

    from redrive.spark import route_failures

    frame = (spark.read.format("redrive-kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("includeHeaders", "true").load())
    error = F.struct(F.lit("ParseError").alias("type"), F.lit("cannot parse").alias("message"))
    connection = {"bootstrap.servers": bootstrap, "message.max.bytes": 3000}
    context = spark.sparkContext
    context.setJobGroup(group, "route_with_task_retries")
    raised = None
    try:
        route_failures(frame.withColumn("error", error), connection, group,
                       pipeline_jobs.POLICY, batch_id=0, checkpoint=checkpoint)
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
    tracker = context.statusTracker()
    stages = [stage for job in tracker.getJobIdsForGroup(group)
              for stage in tracker.getJobInfo(job).stageIds]
    return {"raised": raised, "failed_tasks": sum(tracker.getStageInfo(stage).numFailedTasks
                                                  for stage in stages)}


JOBS = {"batch": batch, "pipeline": pipeline, "route_with_task_retries": route_with_task_retries}


def main() -> int:
    master = sys.argv[1]
    # Answers go to the original stdout; everything else written to fd 1, by the JVM that
    # Spark launches among others, goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pipeline_jobs  # beside this script, on sys.path as its directory
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    from redrive.spark import register

    cloudpickle.register_pickle_by_value(pipeline_jobs)

    builder = SparkSession.builder.master(master)
    for key, value in SESSION_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    try:
        answer({"app_id": spark.sparkContext.applicationId, "master": spark.sparkContext.master})
        for line in sys.stdin:
            request = json.loads(line)
            job = JOBS[request.pop("job")]
            try:
                answer(job(spark, **request))
            except Exception as exc:
                traceback.print_exc()
                answer({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
