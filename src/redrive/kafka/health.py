"""Whether a runtime can reach its brokers: one place that notices an outage and its end.

librdkafka reconnects by itself, so a runtime need not restart after an outage; what it lacks
is a signal. Its error callback says when every broker is down (a refused connection, a
resolution failure) but never when one is back, and a broker that stops answering without
closing its connections (a paused process, a partition in the network) raises no error at all
until a request times out. So a `BrokerHealth` is told of trouble from both sides: librdkafka's
callback (`on_error`, installed in each client the runtime builds through `watch`) and the
runtime's own failed requests (`trouble`: an unconfirmed delivery, a commit that timed out). It
is told the broker is back by any request that succeeded (`ok`: an acknowledged copy, a commit)
or, while the runtime has nothing to send, by a metadata request it makes itself at growing
intervals (`tick`). A runtime with nothing to commit makes no request but its fetches, whose
timeouts librdkafka reports only after socket.timeout.ms (a minute): so `tick` also asks for
metadata when nothing has been heard for QUIET_PROBE_S, and a request that goes unanswered
then is trouble like any other.

An outage is logged once when it starts and once when it ends, with how long it lasted, and is
exposed as `redrive_broker_up` (1 or 0) in the runtime's metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

from redrive.errors import DeliveryFailed
from redrive.kafka.causes import causes, kafka_error
from redrive.kafka.config import Connection

log = logging.getLogger("redrive.kafka.health")

# librdkafka's codes for "no broker can be reached", as opposed to one request or one of several
# brokers failing (which it retries by itself).
DOWN_CODES = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})
# Requests that failed because the broker did not answer: a broker that went away.
UNREACHED_CODES = DOWN_CODES | {KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
                                KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT}
FIRST_PROBE_S = 0.5
MAX_PROBE_S = 30.0
PROBE_TIMEOUT_S = 1.0
ANNOUNCE_AFTER_S = 3.0
# One metadata request per quiet spell this long: nothing to a broker, and an outage is seen in
# seconds rather than librdkafka's minute.
QUIET_PROBE_S = 5.0


class UpGauge(Protocol):
    def broker_up(self, up: bool) -> None: ...


class Probed(Protocol):
    """Any confluent-kafka client: each can ask the cluster for its metadata."""

    def list_topics(self, topic: str | None = ..., *, timeout: float = ...) -> Any: ...


class BrokerHealth:
    """One runtime's view of whether its brokers are reachable (see the module's doc).

    who: how the log lines name the runtime ("group billing", "delay service").
    gauge: where `redrive_broker_up` is set (the runtime's Metrics).
    topic: one of the runtime's topics, the only one its checks ask about: a whole cluster's
        metadata, asked for every quiet spell by every idle runtime, can be large. None where
        the checks go through a producer: librdkafka's producers ask for one topic's metadata
        allowing the cluster to create it (allow.auto.create.topics), so checks about a topic
        deleted since would bring it back where the brokers create topics on demand.
    """

    def __init__(self, who: str, gauge: UpGauge | None = None, *, topic: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        self._gauge = gauge
        self._topic = topic
        self._clock = clock
        self._lock = threading.Lock()  # librdkafka's callbacks may come from any client's poll
        self._down_since: float | None = None
        self._why = ""
        self._announced = False
        self._timer: threading.Timer | None = None
        self._probe_every = FIRST_PROBE_S
        self._probe_at = 0.0
        self._heard_at = clock()
        self.outages = 0
        if gauge is not None:
            gauge.broker_up(True)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def watch(self, connection: Connection) -> dict[str, Any]:
        """`connection` as a config whose clients report their errors here (a user's own
        error_cb, if the config has one, is still called first)."""
        config: dict[str, Any] = ({"bootstrap.servers": connection}
                                  if isinstance(connection, str) else dict(connection))
        theirs = config.get("error_cb")

        def on_error(error: KafkaError) -> None:
            if theirs is not None:
                theirs(error)
            self.on_error(error)

        config["error_cb"] = on_error
        return config

    def on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback."""
        if error.code() in DOWN_CODES:
            self.trouble(error.str())

    def trouble(self, why: str) -> None:
        """A request to the brokers failed for want of an answer. The outage is announced (the
        log line, the gauge) once it has lasted ANNOUNCE_AFTER_S, from a timer, since the
        runtime's thread may be blocked in a request: librdkafka also says every broker is down
        for a moment while it reconnects to a restarted one."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = self._clock()
            self._why = why
            self._announced = False
            self._probe_every = FIRST_PROBE_S
            self._probe_at = self._down_since + FIRST_PROBE_S
            self._timer = threading.Timer(ANNOUNCE_AFTER_S, self._announce)
            self._timer.daemon = True
            self._timer.start()

    def _announce(self) -> None:
        with self._lock:
            if self._down_since is None or self._announced:
                return
            self._announced = True
            self.outages += 1
            # Set with the state it shows: an ok() between the two would otherwise be undone.
            if self._gauge is not None:
                self._gauge.broker_up(False)
        log.error("%s: the brokers cannot be reached (%s); carrying on without committing "
                  "anything unconfirmed, and checking again at growing intervals", self.who,
                  self._why)

    def failed(self, exc: BaseException) -> bool:
        """Whether `exc` (from a request), or an exception it was raised from, says the broker
        did not answer; if so, trouble(). The causes count because callers see wrappers: an
        aborted transaction raised from its timed-out call, say."""
        for seen in causes(exc):
            if isinstance(seen, DeliveryFailed):
                if seen.unanswered:
                    self.trouble(str(seen))
                return seen.unanswered
            error = kafka_error(seen)
            if error is not None and error.code() in UNREACHED_CODES:
                self.trouble(error.str())
                return True
        return False

    def ok(self) -> None:
        """A request to the brokers succeeded."""
        self._heard_at = self._clock()
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._down_since is None:
                return
            lasted = self._clock() - self._down_since
            announced, self._down_since = self._announced, None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if announced and self._gauge is not None:
                self._gauge.broker_up(True)
        if announced:
            log.warning("%s: the brokers answer again after %.1fs", self.who, lasted)

    def tick(self, client: Probed) -> None:
        """Call it from the runtime's loop at each turn. While down, when the next check is
        due, ask the cluster for metadata through `client`: each failed check doubles the wait
        before the next, up to MAX_PROBE_S; a check that succeeds ends the outage. While up,
        ask once nothing has been heard for QUIET_PROBE_S: a check that goes unanswered starts
        an outage (announced after ANNOUNCE_AFTER_S, unless a request succeeds first)."""
        now = self._clock()
        if self._down_since is None:
            if now - self._heard_at < QUIET_PROBE_S:  # the common case, without the lock
                return
            self._heard_at = now  # one check per quiet spell, whatever its answer
            try:
                client.list_topics(self._topic, timeout=PROBE_TIMEOUT_S)
            except KafkaException as exc:
                self.failed(exc)
            return
        with self._lock:
            if self._down_since is None or now < self._probe_at:
                return
        try:
            client.list_topics(self._topic, timeout=PROBE_TIMEOUT_S)
        except KafkaException:
            with self._lock:
                self._probe_every = min(MAX_PROBE_S, self._probe_every * 2)
                self._probe_at = self._clock() + self._probe_every
            return
        self.ok()
