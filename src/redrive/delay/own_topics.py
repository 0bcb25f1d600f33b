"""The delay service's own topics: its tiers and dead-letter topic, created or checked at start,
and the tiers of a former set that still hold records."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping

from redrive import kafka
from redrive.clock import now_ms
from redrive.delay.tiers import Tier, Tiers
from redrive.errors import DelayServiceError, UnknownTopic
from redrive.kafka.admin import waiting_past

log = logging.getLogger(__name__)

DEFAULT_PARTITIONS = 6
TOPIC_READY_TIMEOUT_S = 30.0


def check_topics(tiers: Tiers, existing: Mapping[str, int]) -> None:
    """For a service that does not create its topics: each must exist. Left to the subscription,
    a missing tier is only read after the next metadata refresh (minutes) once a broker made it
    on first write, or never where none does."""
    for topic in tiers.owned_topics:
        if topic not in existing:
            raise UnknownTopic(topic, "a topic of this delay service's tiers: create it, or "
                                      "start the service with topic creation on")


def former_tiers(connection: kafka.Connection, tiers: Tiers, group_id: str,
                 partitions: Mapping[str, int], known: Collection[str] = ()) -> dict[str, Tier]:
    """The tier topics of another set of tiers with this prefix (`partitions`: every topic's
    partition count), other than the `known` ones, that hold records past the service group's
    offsets. A service started with other tiers would leave those records waiting for good: it
    reads these topics too, each record going on through the current tiers."""
    former = {name: tier for name, tier in tiers.named_on(partitions).items()
              if name not in known}
    waiting = waiting_past(connection, group_id, former, partitions)
    for name in sorted(former):
        if waiting[name] > 0:
            log.warning("%s is not among the tiers (%s) but holds up to %d records past group "
                        "%s's offsets (a tier of the tiers the service ran with before); "
                        "reading it too, so that they are forwarded", name,
                        ", ".join(tiers.topics), waiting[name], group_id)
    return {name: tier for name, tier in former.items() if waiting[name] > 0}


class FormerTiers:
    """The former tiers a service reads (see former_tiers): those found at its start, and those
    found since (redrive.former_looks)."""

    def __init__(self, connection: kafka.Connection, tiers: Tiers, group_id: str) -> None:
        self.found: dict[str, Tier] = {}
        self._connection = connection
        self._tiers = tiers
        self._group_id = group_id

    def look(self, partitions: Mapping[str, int]) -> bool:
        """Add the former tiers that hold records; whether any was not read before."""
        new = former_tiers(self._connection, self._tiers, self._group_id, partitions,
                           known=self.found)
        self.found.update(new)
        return bool(new)


def ensure_topics(connection: kafka.Connection, tiers: Tiers,
                  partitions: int = DEFAULT_PARTITIONS,
                  timeout_s: float = TOPIC_READY_TIMEOUT_S) -> list[str]:
    """Create the missing tier and dead-letter topics; return once metadata shows them all."""
    admin = kafka.admin(connection)
    created = kafka.create_topics(admin, {topic: partitions for topic in tiers.owned_topics})
    deadline = now_ms() + int(timeout_s * 1000)
    while True:
        counts = kafka.topic_partitions(admin)
        missing = [topic for topic in tiers.owned_topics if topic not in counts]
        if not missing:
            for topic in tiers.owned_topics:
                if counts[topic] < partitions:
                    # A tier a producer wrote to before the service first ran, on a broker
                    # that creates topics on first use: it serves, with less parallelism.
                    log.warning("delay tier %s has %d partition(s), fewer than the %d this "
                                "service creates: a broker made it when it was first written "
                                "to; add partitions with your Kafka tools if it needs them",
                                topic, counts[topic], partitions)
            return created
        if now_ms() > deadline:
            raise DelayServiceError(f"topics {missing} still missing from metadata after "
                                    f"{timeout_s}s")
        time.sleep(0.05)
