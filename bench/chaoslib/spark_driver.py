"""A RetryPipeline's driver in a process of its own, for the fault that SIGKILLs it mid-stream:

    python -m chaoslib.spark_driver '{"bootstrap": ..., "topic": ..., "group": ...,
                                      "sink": ..., "checkpoint": ..., "per_trigger": N}'

It prints "running" as the pipeline starts, {"batch": id} for each batch it reports, and
"stopped" once SIGTERM stopped it between batches. Its JVM is in its process group, so killing
the group is a driver crash.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> int:
    arguments: dict[str, Any] = json.loads(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    from chaoslib import spark_job, workload
    from redrive.spark import RetryPipeline, register

    cloudpickle.register_pickle_by_value(spark_job)
    cloudpickle.register_pickle_by_value(workload)
    spark = (SparkSession.builder.master("local[2]").appName("redrive-chaos")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def reported(batch: int, _stats: object) -> None:
        print(json.dumps({"batch": batch}), flush=True)

    pipeline = RetryPipeline(
        spark, arguments["bootstrap"], arguments["topic"], arguments["group"],
        spark_job.POLICY, function=spark_job.handle, output_schema=spark_job.OUTPUT_SCHEMA,
        sink=arguments["sink"], checkpoint=arguments["checkpoint"],
        trigger_interval="200 milliseconds",
        max_offsets_per_trigger=int(arguments["per_trigger"]), on_batch=reported)
    # The query started before "running": a SIGTERM meets run(), which stops between batches.
    pipeline.start()
    print("running", flush=True)
    pipeline.run()
    print("stopped", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
