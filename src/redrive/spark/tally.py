"""What a DataFrame-form batch's rows were: its rows by class (status, attempt, topic), how many
of them came before their due time, a sample of lateness past due, and how many rows the
transform failed.

These are counted while the batch is written, as Spark's observed metrics of the write, rather
than by a job of their own: a job's fixed cost is about half a second to a second here, which
was a third of a 2,000-record batch's time. A record without redrive's headers (attempt 0, no
due time, no group, nothing malformed: most of them) is only counted, per topic; each other row
adds one number to a list, its class packed into a long. Should the metrics be missing (a sink
function that ran no action over its rows, a table sink on Spark Connect), or a row's topic not
be one the query reads, the same figures come from a job of their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redrive.spark.columns import REDRIVE_COLUMN
from redrive.spark.outcomes import FAILED, OK, SAMPLE, SKIPPED
from redrive.spark.sql import error_set, functions, observation, observed

_STATUSES = (OK, FAILED, SKIPPED)


@dataclass(frozen=True)
class Tally:
    counted: tuple[dict[str, Any], ...]  # status, attempt, topic, n, early
    failed: int  # rows the transform failed
    late_s: tuple[float, ...]
    observed: bool  # counted as the batch was written, not by a job of its own
    # The group's records per partition, where asked for and observed (for the brake).
    per_partition: dict[tuple[str, int], int] | None = None


class BatchTally:
    """The tally of one batch. Attach `observe_batch` to the batch and `observe_output` to the
    transform's output before the sink writes them; `result` after."""

    def __init__(self, frame: Any, group: str, topics: Sequence[str], now_ms: int,
                 partitions: Mapping[str, int] | None = None) -> None:
        F = functions(frame)
        self._F = F
        self._topics = tuple(topics)
        redrive = F.col(REDRIVE_COLUMN)
        owner = redrive.getField("group")
        self.mine = owner.isNull() | (owner == F.lit(group))
        self.malformed = redrive.getField("malformed").isNotNull()
        due = redrive.getField("due")
        self._status = (F.when(~self.mine, F.lit(_STATUSES.index(SKIPPED)))
                        .when(self.malformed, F.lit(_STATUSES.index(FAILED)))
                        .otherwise(F.lit(_STATUSES.index(OK))))
        self._attempt = redrive.getField("attempt")
        self._early = due > F.timestamp_millis(F.lit(now_ms))
        self._late = F.when(self.mine & due.isNotNull(),
                            (F.lit(now_ms) - F.unix_millis(due)) / 1000)
        self._plain = ((self._attempt == 0) & due.isNull() & owner.isNull() & ~self.malformed)
        # Counted per partition only where asked: an expression per partition the query reads.
        self._partitions = ([] if partitions is None else
                            [(t, p) for t in self._topics for p in range(partitions.get(t, 0))])
        self._of_batch = observation(frame) if self._topics else None
        self._of_output = observation(frame) if self._topics else None

    def observe_batch(self, frame: Any) -> Any:
        if self._of_batch is None:
            return frame
        F = self._F
        # 1-based; 0 for a topic the query does not read.
        topic = F.array_position(F.array(*(F.lit(t) for t in self._topics)), F.col("topic"))
        key = ((((self._attempt.cast("long") * len(self._topics) + (topic - 1)) * len(_STATUSES)
                 + self._status) * 2) + F.when(self._early, 1).otherwise(0))
        return frame.observe(
            self._of_batch,
            *(F.count_if(self._plain & (topic == index + 1)).alias(f"plain{index}")
              for index in range(len(self._topics))),
            F.count_if(topic == 0).alias("elsewhere"),
            *(F.count_if(self.mine & (topic == self._topics.index(t) + 1)
                         & (F.col("partition") == p)).alias(f"partition{index}")
              for index, (t, p) in enumerate(self._partitions)),
            F.collect_list(F.when(~self._plain, key)).alias("keys"),
            F.slice(F.collect_list(self._late), 1, SAMPLE).alias("late"))

    def observe_output(self, output: Any, error_column: str) -> Any:
        if self._of_output is None:
            return output
        F = self._F
        return output.observe(self._of_output,
                              F.count_if(error_set(output, error_column)).alias("errors"))

    def result(self, frame: Any, output: Any, error_column: str) -> Tally:
        """The observed tally, or one counted by a job when there is none."""
        of_batch = observed(self._of_batch) if self._of_batch is not None else None
        of_output = observed(self._of_output) if self._of_output is not None else None
        # On Spark Connect, a write by SQL over a view of the observed rows (a table sink that
        # exists) hands back metrics without these names: taken as missing.
        if (of_batch is None or of_output is None or "elsewhere" not in of_batch
                or "errors" not in of_output or of_batch["elsewhere"]):
            return self.counted_by_job(frame, output, error_column)
        classes: Counter[tuple[str, int, str]] = Counter()
        early: Counter[tuple[str, int, str]] = Counter()
        for index, topic in enumerate(self._topics):
            if of_batch[f"plain{index}"]:
                classes[(OK, 0, topic)] += of_batch[f"plain{index}"]
        topics, statuses = len(self._topics), len(_STATUSES)
        for key in of_batch["keys"]:
            rest, was_early = divmod(key, 2)
            rest, status = divmod(rest, statuses)
            attempt, topic_index = divmod(rest, topics)
            found = (_STATUSES[status], attempt, self._topics[topic_index])
            classes[found] += 1
            early[found] += was_early
        counted = tuple({"status": status, "attempt": attempt, "topic": topic, "n": n,
                         "early": early[(status, attempt, topic)]}
                        for (status, attempt, topic), n in classes.items())
        return Tally(counted, of_output["errors"], tuple(of_batch["late"]), observed=True,
                     per_partition=self._per_partition(of_batch, classes))

    def _per_partition(self, of_batch: Mapping[str, Any],
                       classes: Mapping[tuple[str, int, str], int]
                       ) -> dict[tuple[str, int], int] | None:
        """The group's records per partition, where asked for and all of them counted (a
        partition not known when the batch began is not)."""
        if not self._partitions:
            return None
        found = {tp: of_batch[f"partition{index}"] for index, tp in enumerate(self._partitions)
                 if of_batch[f"partition{index}"]}
        mine = sum(n for (status, _, _), n in classes.items() if status != SKIPPED)
        return found if sum(found.values()) == mine else None

    def counted_by_job(self, frame: Any, output: Any, error_column: str) -> Tally:
        F = self._F
        classes = (frame.groupBy(self._status.alias("status"), self._attempt.alias("attempt"),
                                 "topic")
                   .agg(F.count(F.lit(1)).alias("n"), F.count_if(self._early).alias("early"),
                        F.slice(F.collect_list(self._late), 1, SAMPLE).alias("late")))
        errors = (output.where(error_set(output, error_column))
                  .agg(F.count(F.lit(1)).alias("n"))
                  .select(F.lit(-1).alias("status"), F.lit(None).cast("int").alias("attempt"),
                          F.lit(None).cast("string").alias("topic"), "n",
                          F.lit(0).cast("long").alias("early"),
                          F.array().cast("array<double>").alias("late")))
        rows = classes.unionByName(errors).collect()  # one job: on Connect, one round trip
        counted = tuple({"status": _STATUSES[row["status"]], "attempt": row["attempt"],
                         "topic": row["topic"], "n": row["n"], "early": row["early"]}
                        for row in rows if row["status"] >= 0)
        failed = sum(row["n"] for row in rows if row["status"] < 0)
        late_s = tuple(value for row in rows for value in row["late"])[:SAMPLE]
        return Tally(counted, failed, late_s, observed=False)
