"""retry_stream: the gated streaming DataFrame a group reads (its main topics and their retry
topics), with redrive's headers decoded into the `redrive` column; and the Subscription behind it,
which RetryPipeline shares."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from redrive import kafka, retention, topics
from redrive.arguments import check_instance
from redrive.backends import BoundBackend, RetryBackend, RetryTopics
from redrive.errors import InvalidArgument
from redrive.policy import RetryPolicy
from redrive.spark.columns import REDRIVE_COLUMN
from redrive.spark.sql import functions

log = logging.getLogger("redrive.spark")


# Where a new checkpoint starts on the main topics: "earliest", "latest", Spark's JSON of offsets
# per partition, or a time (an aware datetime): each partition's first record at or after it.
Starting = str | datetime


def starting_option(starting: Starting) -> dict[str, str]:
    """The source option saying `starting`: startingOffsets, or startingTimestamp for a time."""
    if isinstance(starting, datetime):
        if starting.tzinfo is None:
            raise InvalidArgument("starting_offsets", starting,
                                  "a datetime must say its time zone (for example "
                                  "datetime(2026, 11, 27, 9, tzinfo=timezone.utc))")
        return {"startingTimestamp": str(int(starting.timestamp() * 1000))}
    expected = "expected 'earliest', 'latest', offsets as Spark's JSON, or a datetime"
    if not isinstance(starting, str):
        raise InvalidArgument("starting_offsets", starting, expected)
    if starting.strip().lower() not in ("earliest", "latest"):
        # Whether its topics are read is checked when the source is planned.
        try:
            parsed = json.loads(starting)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InvalidArgument("starting_offsets", starting, expected)
    return {"startingOffsets": starting}


class Subscription:
    """What one group reads and where its failures go, checked before anything starts."""

    def __init__(self, connection: kafka.Connection, topics_: str | Sequence[str], group: str,
                 policy: RetryPolicy, retry_backend: RetryBackend | None = None, *,
                 fail_on_data_loss: bool = True) -> None:
        self.connection = connection
        # Spark's failOnDataLoss: whether records gone before they were read (retention, the
        # group stopped too long) stop the query, or are logged and skipped.
        check_instance("fail_on_data_loss", fail_on_data_loss, bool, "True or False")
        self.fail_on_data_loss = fail_on_data_loss
        self.main_topics = [topics_] if isinstance(topics_, str) else list(topics_)
        if not self.main_topics:
            raise InvalidArgument("topics", topics_, "name at least one topic")
        topics.check_names("topics", self.main_topics)
        self.group = topics.check_name("group", group)
        check_instance("policy", policy, RetryPolicy, "a RetryPolicy")
        self.policy = policy
        self.plans = topics.plans(policy, self.main_topics, self.group)
        if retry_backend is not None and not isinstance(retry_backend, RetryBackend):
            raise InvalidArgument("retry_backend", retry_backend,
                                  "must be a RetryBackend (RetryTopics(), DelayQueue(...) "
                                  "or a StoreBackend)")
        self.retry_backend = retry_backend if retry_backend is not None else RetryTopics()
        self.backend: BoundBackend = self.retry_backend.bind(self.group)
        if self.backend.sequential:
            raise InvalidArgument("retry_backend", self.retry_backend,
                                  "per-key ordering needs records handled one by one in order; "
                                  "a Spark batch handles them in parallel (use RetryingConsumer)")
        self.topics_backend = isinstance(self.retry_backend, RetryTopics)
        if policy.dead_letter_limit is not None and not self.topics_backend:
            raise InvalidArgument("policy.dead_letter_limit", policy.dead_letter_limit,
                                  "a Spark pipeline's brake judges the failures it copies to "
                                  "retry topics, the default backend; not with "
                                  f"{type(self.retry_backend).__name__}")
        policies = {self.backend.policy_for(topic, policy) for topic in self.main_topics}
        if len(policies) > 1:
            raise InvalidArgument("retry_backend", self.retry_backend,
                                  "one pipeline routes with one policy; its topics have several")
        self.route_policy = policies.pop()
        # Metrics are labelled by main topic, as in every runtime, whichever topic a record is on.
        self.main_of = {name: plan.topic for plan in self.plans.values()
                        for name in [*plan.consumed_topics, *plan.created_topics]}
        # Retry topics of an earlier policy that still hold records (found by ensure_topics).
        self.former: dict[str, str] = {}

    @property
    def consumed_topics(self) -> list[str]:
        return [*self._planned_topics, *self.former]

    @property
    def _planned_topics(self) -> list[str]:
        return [name for plan in self.plans.values()
                for name in self.backend.consumed_topics(plan)]

    @property
    def destinations(self) -> list[str]:
        """The topics failed records are copied to (retry and dead-letter topics, or the
        delay tiers and dead-letter topics)."""
        return self.backend.copy_topics(self.plans)

    def ensure_topics(self) -> dict[str, int]:
        """Create what the retry backend needs, and find the retry topics of an earlier policy
        that still hold records, to be read too; return every topic's partition count.
        Refuses retry topics that would delete copies before they are due."""
        admin = kafka.admin(self.connection)
        for warning in self.backend.prepare(admin, self.plans):
            log.warning("pipeline %s: %s", self.group, warning)
        retention.check(admin, self.backend.waits(self.plans))
        partitions = kafka.topic_partitions(admin)
        self.former = topics.former_retry_topics(self.connection, self.group, self.main_topics,
                                                 self._planned_topics, partitions)
        self.main_of.update(self.former)
        return partitions

    def source_options(self, starting_offsets: Starting = "earliest",
                       max_offsets_per_trigger: int | None = None) -> dict[str, str]:
        config = kafka.client_config(self.connection)
        options = {f"kafka.{key}": str(value) for key, value in config.items()}
        options.update({
            "subscribe": ",".join(self.consumed_topics),
            **starting_option(starting_offsets),
            "includeHeaders": "true",
            "redrive.group": self.group,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
        })
        # Only retry copies carry due times; scanning the main topics would only cost. A store's
        # scheduler publishes a copy only once it is due; an earlier policy's copies wait in its
        # retry topics whatever the backend now.
        gated = [name for name in self.consumed_topics if name not in self.main_topics
                 and (self.topics_backend or name in self.former)]
        # Retry topics hold the group's own unfinished copies: a new checkpoint goes on where
        # the group stood on them, whatever starting_offsets says of the main topics.
        resumed = [name for name in self.consumed_topics if name not in self.main_topics]
        if resumed:
            options["redrive.resumeTopics"] = ",".join(resumed)
        if gated:
            options["redrive.gatedTopics"] = ",".join(gated)
        else:
            options["redrive.gate"] = "false"
        if max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
        return options

    def stream(self, spark: Any, starting_offsets: Starting = "earliest",
               max_offsets_per_trigger: int | None = None) -> Any:
        """The source's streaming DataFrame with the `redrive` column, every record included."""
        from redrive.spark.source import register

        register(spark)
        return spark.readStream.format("redrive-kafka").options(
            **self.source_options(starting_offsets, max_offsets_per_trigger),
            **{"redrive.decodeHeaders": "true"}).load()

    def mine(self, frame: Any) -> Any:
        """Rows of `frame` this group handles: copies another group failed are not."""
        F = functions(frame)
        owner = F.col(REDRIVE_COLUMN).getField("group")
        return owner.isNull() | (owner == F.lit(self.group))


def warn_if_speculative(spark: Any, group: str) -> bool:
    """Log a warning if the session runs speculative tasks, and say whether it does. A
    speculative attempt of a routing task runs beside the first: both find the same copies
    missing and write them, so the failed records of that task come back twice (nothing is lost;
    the batch ledger covers attempts that follow one another, not attempts side by side)."""
    speculative = str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true"
    if speculative:
        log.warning("pipeline %s: spark.speculation is on: a speculative attempt of a task that "
                    "copies failed records writes its copies again beside the first attempt, "
                    "so those records are retried twice; turn it off for this query's session",
                    group)
    return speculative


def retry_stream(spark: Any, connection: kafka.Connection, topics_: str | Sequence[str],
                 group: str, policy: RetryPolicy, *, retry_backend: RetryBackend | None = None,
                 starting_offsets: Starting = "earliest",
                 max_offsets_per_trigger: int | None = None,
                 fail_on_data_loss: bool = True) -> Any:
    """The streaming DataFrame `group` handles: its main topics and retry topics (created if
    missing), each retry admitted only once due, with the Kafka columns and `redrive` (attempt,
    first_failure, original_topic/partition/offset/timestamp, due, group, target, malformed).

    Rows whose `redrive.malformed` is set must not be treated as successes: `route_failures`
    dead-letters them whatever your error column says. `fail_on_data_loss` is Spark's
    failOnDataLoss: with False, records deleted before the query read them are logged and skipped
    instead of stopping it.
    """
    subscription = Subscription(connection, topics_, group, policy, retry_backend,
                                fail_on_data_loss=fail_on_data_loss)
    subscription.ensure_topics()
    warn_if_speculative(spark, group)
    frame = subscription.stream(spark, starting_offsets, max_offsets_per_trigger)
    return frame.where(subscription.mine(frame))
