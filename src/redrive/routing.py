"""The routing decision, pure: a failed record, its error, the policy and the time -> where it goes.

No I/O happens here; every runtime calls `route` and then produces what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from redrive import headers as h
from redrive import topics
from redrive.dead_letter_headers import spring_fields
from redrive.errors import MalformedHeader
from redrive.headers import Headers
from redrive.policy import Disposition, HeaderFormat, RetryPolicy
from redrive.record import Delivery, ErrorInfo, Origin, Record


@dataclass(frozen=True)
class Retry:
    topic: str
    due_ms: int
    headers: Headers
    attempt: int  # failed deliveries so far, this one included
    partition: int | None  # the source partition, kept when the retry topic has it


@dataclass(frozen=True)
class DeadLetter:
    topic: str | None  # None: the policy has no dead-letter topic and the record is dropped
    headers: Headers
    reason: str
    attempt: int
    partition: int | None


Route = Retry | DeadLetter



def route(record: Record, error: BaseException | ErrorInfo, policy: RetryPolicy, now_ms: int,
          *, group: str, delivery: Delivery | None = None) -> Route:
    """Decide where a record that failed in `group` goes next.

    The record's history is read from its headers here, not trusted from `record.delivery`, so
    that a record whose redrive headers cannot be parsed is dead-lettered as `malformed` wherever
    it fails; the runtime may also pass the MalformedHeader it met as the error. A caller that
    itself parsed `record.headers` with `headers.read_delivery` without error may pass the result
    as `delivery` to spare the second parse.
    """
    info = ErrorInfo.of(error)
    if delivery is None:
        try:
            delivery = h.read_delivery(record.headers)
        except MalformedHeader as exc:
            return _malformed(record, ErrorInfo.from_exception(exc), policy, now_ms, group)
    # An error without a type can only come as data (a Spark transform's error column): it
    # cannot be classified, and is kept whole as a malformed dead letter rather than guessed at.
    if isinstance(info.exception, MalformedHeader) or not info.type_name:
        return _malformed(record, info, policy, now_ms, group)

    origin = delivery.original or Origin(record.topic, record.partition, record.offset,
                                         record.timestamp_ms)
    attempt = delivery.attempt + 1
    first_failure = delivery.first_failure_ms if delivery.first_failure_ms is not None \
        else now_ms
    plan = topics.plan(policy, origin.topic, group)
    common: dict[str, str | int | None] = {
        h.ATTEMPT: attempt,
        h.GROUP: group,
        h.FIRST_FAILURE: first_failure,
        **h.origin_fields(origin),
        **h.error_fields(info, message_limit=policy.max_error_message_bytes,
                         trace_limit=policy.max_error_trace_bytes),
    }

    dead = None
    if policy.disposition(info) is Disposition.DEAD_LETTER:
        dead = "not-retryable"
    elif attempt >= policy.max_attempts:
        dead = "exhausted"
    else:
        due = now_ms + policy.backoff.delay_ms(attempt)
        deadline = policy.max_retry_period_ms
        if deadline is not None and due > first_failure + deadline:
            dead = "deadline"
    if dead is not None:
        return _dead(plan, record, {**common, **_foreign(policy, origin, info, group)}, dead,
                     attempt, origin)
    retry_topic = plan.retry_topic_for(attempt)
    updates = {**common, h.DUE: due, h.REASON: None}
    return Retry(retry_topic.name, due, h.replace(record.headers, updates), attempt,
                 origin.partition)


def _foreign(policy: RetryPolicy, origin: Origin, info: ErrorInfo,
             group: str) -> dict[str, bytes | None]:
    """The other systems' dead-letter headers the policy asks for besides redrive's."""
    if policy.dead_letter_format is HeaderFormat.SPRING:
        return spring_fields(origin, info, group, message_limit=policy.max_error_message_bytes,
                             trace_limit=policy.max_error_trace_bytes)
    return {}


def _dead(plan: topics.TopicPlan, record: Record,
          common: dict[str, str | int | bytes | None],
          reason: str, attempt: int, origin: Origin) -> DeadLetter:
    # A dead letter carries no due time, so that readers of the dead-letter topic never wait.
    updates = {**common, h.REASON: reason, h.DUE: None}
    return DeadLetter(plan.dead_letter, h.replace(record.headers, updates), reason, attempt,
                      origin.partition)


def _malformed(record: Record, info: ErrorInfo, policy: RetryPolicy, now_ms: int,
               group: str) -> DeadLetter:
    """Dead-letter a record whose redrive headers are unreadable, keeping them renamed.

    The unreadable values stay on the record as `redrive-malformed-<name>`, so nothing of its
    story is lost and the dead-letter record's own redrive headers parse cleanly.
    """
    kept = h.set_aside(record.headers)
    origin = Origin(record.topic, record.partition, record.offset, record.timestamp_ms)
    plan = topics.plan(policy, _source_topic(record, group), group)
    updates: dict[str, str | int | bytes | None] = {
        h.ATTEMPT: 1,
        h.GROUP: group,
        h.FIRST_FAILURE: now_ms,
        **h.origin_fields(origin),
        **h.error_fields(info, message_limit=policy.max_error_message_bytes,
                         trace_limit=policy.max_error_trace_bytes),
        h.REASON: "malformed",
        **_foreign(policy, origin, info, group),
    }
    return DeadLetter(plan.dead_letter, h.replace(kept, updates), "malformed", 1,
                      record.partition)


def _source_topic(record: Record, group: str) -> str:
    """The main topic a record belongs to: a retry topic's name starts with it."""
    return topics.retried_topic(record.topic, group) or record.topic
