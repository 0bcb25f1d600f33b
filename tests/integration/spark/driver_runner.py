"""A pipeline's driver in a process of its own, for tests that SIGKILL it mid-stream:

    python driver_runner.py '{"bootstrap": ..., "topic": ..., "group": ..., "form": ...,
                              "sink": ..., "checkpoint": ...}'

It runs pipeline_jobs.pipeline on a classic local[2] session and prints one JSON line per batch
the pipeline reports ({"batch": id}), then "stopped" once a SIGTERM has stopped it between
batches. Everything else it writes goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    arguments = json.loads(sys.argv[1])
    lines = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the JVM's and Spark's output
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pipeline_jobs
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    from redrive.spark import register

    cloudpickle.register_pickle_by_value(pipeline_jobs)
    spark = (SparkSession.builder.master("local[2]").appName("redrive-driver-crash")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def reported(batch: int, _stats: object) -> None:
        lines.write(json.dumps({"batch": batch}) + "\n")
        lines.flush()

    pipeline = pipeline_jobs.pipeline(spark, **arguments, trigger_interval="200 milliseconds",
                                      max_offsets_per_trigger=100, on_batch=reported)
    pipeline.run()
    lines.write("stopped\n")
    lines.flush()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
