"""Routes of records failing for the first time: made once per (topic, error), stamped per record.

A record without redrive's headers has no history: its route depends on its topic, the error and
the time, and its copy's headers are its own followed by redrive's, of which only the origin
(partition, offset, timestamp) and the due time differ from record to record. A batch's failures
mostly share one error (an outage, a bad deploy), so `routing.route`'s general path, which reads
the history, classifies the error and builds every header anew (16-18 us a record with the
collector paused, as in a Spark task, against 5-8 us here), is taken once per (topic, error) and
each record pays for its own fields only. The result is the same Route `routing.route` gives,
header for header (tests/unit/test_first_failures.py).

A RetryingConsumer makes one per poll batch and passes each record's own clock: its first failure
and due time are the moment it failed, however long the batch's other records took.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redrive import headers as h
from redrive import topics
from redrive.errors import MalformedHeader
from redrive.policy import Disposition, HeaderFormat, RetryPolicy
from redrive.record import ErrorInfo
from redrive.routing import DeadLetter, Retry, Route

_Pairs = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class _Template:
    before_first: _Pairs  # attempt, group
    after_origin: _Pairs  # the error's type, message and trace
    topic_name: bytes
    dead_reason: str | None  # a reason every record of this (topic, error) is dead-lettered for
    retry_topic: str | None
    dead_letter: str | None


class FirstFailures:
    """Routes of first failures in `group` under `policy`, at `now_ms` (one batch's clock) unless
    `route` is given a record's own.

    `route` answers None where the general path must decide: a record carrying redrive headers
    (a retry copy, or unreadable ones), an error without a type or a MalformedHeader, and a dead
    letter whose policy asks for other systems' headers too (they hold the origin).
    The policy's classifiers see each distinct error once, or each raised one where a classifier
    may read the live exception (a `predicate`), which two errors equal as data need not share.
    """

    def __init__(self, policy: RetryPolicy, group: str, now_ms: int) -> None:
        self.policy = policy
        self.group = group
        self.now_ms = now_ms
        self._templates: dict[tuple[str, ErrorInfo, Disposition | None], _Template | None] = {}
        self._foreign = policy.dead_letter_format is not HeaderFormat.REDRIVE
        self._last: tuple[str, ErrorInfo, _Template | None] | None = None
        self._by_data = policy.routes_by_data

    def route(self, topic: str, partition: int, offset: int, timestamp_ms: int | None,
              headers: Sequence[tuple[str, bytes | None]], error: ErrorInfo,
              now_ms: int | None = None) -> Route | None:
        for name, _ in headers:
            if name.startswith(h.PREFIX):
                return None
        last = self._last
        if last is not None and last[1] is error and last[0] == topic:
            template = last[2]  # the common case: the same error as the record before
        else:
            key: tuple[str, ErrorInfo, Disposition | None] = (topic, error, None)
            if not self._by_data and error.exception is not None:
                key = (topic, error, self.policy.disposition(error))
            if key in self._templates:
                template = self._templates[key]
            else:
                template = self._template(topic, error, key[2])
                self._templates[(topic, error.detached(), key[2])] = template
            # Nothing here keeps a live exception: its traceback holds the frames that caught it,
            # and with them the batch being handled (see ErrorInfo.detached). Errors that are
            # data (a Spark batch's, decoded once per distinct error) repeat as one object.
            self._last = (topic, error, template) if error.exception is None else None
        if template is None:
            return None
        now = self.now_ms if now_ms is None else now_ms
        reason = template.dead_reason
        due = 0
        if reason is None:
            due = now + self.policy.backoff.delay_ms(1)
            deadline = self.policy.max_retry_period_ms
            if deadline is not None and due > now + deadline:
                reason = "deadline"
        if reason is not None and self._foreign:
            return None
        built = list(headers)
        built += template.before_first
        built.append((h.FIRST_FAILURE, b"%d" % now))
        built.append((h.ORIGINAL_TOPIC, template.topic_name))
        built.append((h.ORIGINAL_PARTITION, b"%d" % partition))
        built.append((h.ORIGINAL_OFFSET, b"%d" % offset))
        timestamp = h.kept_time(timestamp_ms)
        if timestamp is not None:
            built.append((h.ORIGINAL_TIMESTAMP, b"%d" % timestamp))
        built += template.after_origin
        if reason is None:
            assert template.retry_topic is not None
            built.append((h.DUE, b"%d" % due))
            return Retry(template.retry_topic, due, built, 1, partition)
        built.append((h.REASON, reason.encode()))
        return DeadLetter(template.dead_letter, built, reason, 1, partition)

    def _template(self, topic: str, error: ErrorInfo,
                  disposition: Disposition | None) -> _Template | None:
        if isinstance(error.exception, MalformedHeader) or not error.type_name:
            return None
        policy = self.policy
        plan = topics.plan(policy, topic, self.group)
        dead_reason = None
        if disposition is None:
            disposition = policy.disposition(error)
        if disposition is Disposition.DEAD_LETTER:
            dead_reason = "not-retryable"
        elif policy.max_attempts <= 1:
            dead_reason = "exhausted"
        fields = h.error_fields(error, message_limit=policy.max_error_message_bytes,
                                trace_limit=policy.max_error_trace_bytes)
        return _Template(
            before_first=[(h.ATTEMPT, b"1"), (h.GROUP, self.group.encode())],
            after_origin=[(name, value.encode()) for name, value in fields.items()],
            topic_name=topic.encode(),
            dead_reason=dead_reason,
            retry_topic=plan.retry_topic_for(1).name if dead_reason is None else None,
            dead_letter=plan.dead_letter)
