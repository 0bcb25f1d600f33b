"""Looking again, as a runtime goes, for the topics of a former configuration that hold records.

A runtime reads the retry topics of an earlier policy (`topics.former_retry_topics`) and the
delay service the tiers of an earlier set (`delay.own_topics.former_tiers`) while they hold
records. Looked for only at start, records written there afterwards waited for the next
restart: in a rolling deploy, instances not yet redeployed go on writing to them after the first
new one has started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from redrive import kafka
from redrive.errors import BrokerUnavailable

log = logging.getLogger("redrive.former_looks")

LOOK_EVERY_S = 60.0
# Short: the runtime handles nothing while it waits, and a broker that does not answer is asked
# again at the next look.
LOOK_TIMEOUT_S = 2.0


class FormerLooks:
    """Runs a look at the cluster's topics (name -> partition count) every LOOK_EVERY_S."""

    def __init__(self, connection: kafka.Connection, who: str) -> None:
        self._connection = connection
        self._who = who
        self._next_s = time.monotonic() + LOOK_EVERY_S
        # Made at the first look and kept: a new client each minute would connect anew each
        # time (over TLS, a handshake each time).
        self._admin: kafka.Admin | None = None

    def again(self, look: Callable[[dict[str, int]], object]) -> None:
        """`look` once LOOK_EVERY_S has passed since the last time. A broker that does not answer
        costs one short wait, and is asked again next time, never at every poll."""
        if time.monotonic() < self._next_s:
            return
        self._next_s = time.monotonic() + LOOK_EVERY_S
        try:
            if self._admin is None:
                self._admin = kafka.admin(self._connection)
            look(kafka.topic_partitions(self._admin, timeout_s=LOOK_TIMEOUT_S))
        except (BrokerUnavailable, KafkaException) as exc:
            log.info("%s: looking for former topics with records: %s; again in %.0f s",
                     self._who, exc, LOOK_EVERY_S)

    def close(self) -> None:
        """Let the client go with the runtime: kept, it would go on connecting to brokers the
        runtime no longer uses."""
        self._admin = None
