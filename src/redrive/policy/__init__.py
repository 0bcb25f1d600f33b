"""Retry policies: how many attempts, how long between them, which errors retry and how.

    policy = RetryPolicy(
        backoff=Backoff.sequence("5m,5m,30m,30m,30m,1h"),
        not_retryable=[ValueError],
        in_place=InPlace(on=[TimeoutError], retries=3, backoff=Backoff.fixed("200ms")),
        max_retry_period="6h",
    )
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from datetime import timedelta

from redrive.errors import InvalidPolicy
from redrive.policy.backoff import Backoff, Custom, Explicit, Exponential, Fixed
from redrive.policy.brake import DeadLetterLimit
from redrive.policy.classify import (
    ANY_ERROR,
    NO_ERROR,
    ErrorLike,
    ErrorMatcher,
    MatcherSpec,
    as_matcher,
    error_type,
    message_matches,
    predicate,
)
from redrive.policy.duration import Duration, format_ms, to_ms
from redrive.record import ErrorInfo

__all__ = [
    "Backoff", "Custom", "DeadLetterLimit", "Disposition", "Duration", "ErrorMatcher",
    "Explicit", "Exponential", "Fixed", "HeaderFormat", "InPlace", "Naming", "RetryPolicy",
    "error_type", "format_ms", "message_matches", "predicate", "to_ms",
]

DEFAULT_ATTEMPTS = 3
MAX_DELAY_MS = 36_500 * 86_400_000  # 100 years: any due time stays within the headers' range
# A policy's delays are checked, and a plan made, per retry: a million took seconds and a
# billion would take hours. A hundred thousand one-minute retries take ten weeks.
MAX_ATTEMPTS = 100_000


class Disposition(enum.Enum):
    """What the policy wants done with a failed record, before counting attempts."""

    RETRY = "retry"  # non-blocking, through a retry topic
    IN_PLACE = "in-place"  # blocking first, on the same partition, then as RETRY
    DEAD_LETTER = "dead-letter"  # not retryable: straight to the dead-letter topic


class HeaderFormat(enum.Enum):
    """Which dead-letter headers a dead letter carries; redrive's own are always written."""

    REDRIVE = "redrive"
    # Spring Kafka's kafka_dlt-* set besides, binary numbers as Spring encodes them, so that a
    # Java consumer of the dead-letter topic reads it with Spring's own classes.
    SPRING = "spring"


class Naming(enum.Enum):
    PER_DELAY = "per-delay"  # orders.billing.retry.5m: bounded topic count
    PER_ATTEMPT = "per-attempt"  # orders.billing.retry.2: as Spring Kafka does


def check_delays(backoff: Backoff, retries: int, field: str) -> None:
    """Each of the first `retries` delays of `backoff` is one a due time can be made of."""
    for retry in range(1, retries + 1):
        if backoff.nominal_ms(retry) < 0:
            raise InvalidPolicy(f"{field}({retry})", backoff.nominal_ms(retry),
                                "must not be negative")
        if backoff.longest_ms(retry) > MAX_DELAY_MS:
            raise InvalidPolicy(f"{field}({retry})", format_ms(backoff.longest_ms(retry)),
                                "must be at most 36500d (100 years): a due time past the "
                                "year 9999 cannot be written (cap an exponential backoff "
                                "with max=)")


@dataclass(frozen=True)
class InPlace:
    """Errors retried in place (the partition waits) before they are retried through topics.

    `retries` is the in-place budget: how many times the record is retried in place after its
    first failure before it is routed like any retryable error. Keep the budget small: the
    partition waits meanwhile (other partitions go on, and the consumer keeps polling).
    """

    on: MatcherSpec
    retries: int = 3
    backoff: Backoff = field(default_factory=lambda: Backoff.fixed("100ms"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "on", as_matcher(self.on, "in_place.on", NO_ERROR))
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 1:
            raise InvalidPolicy("in_place.retries", self.retries, "must be an integer >= 1")
        if not isinstance(self.backoff, Backoff):
            raise InvalidPolicy("in_place.backoff", self.backoff, "must be a Backoff")
        if self.backoff.implied_attempts is not None \
                and self.backoff.implied_attempts - 1 < self.retries:
            raise InvalidPolicy("in_place.retries", self.retries,
                                f"its backoff has only {self.backoff.implied_attempts - 1} delays")
        check_delays(self.backoff, self.retries, "in_place.backoff")

    @property
    def matcher(self) -> ErrorMatcher:
        assert isinstance(self.on, ErrorMatcher)
        return self.on


@dataclass(frozen=True)
class RetryPolicy:
    """Everything routing needs to decide a failed record's fate.

    attempts counts every delivery, the first included: attempts=4 is the original and three
    retries. A sequence backoff implies its own count (its length + 1).
    """

    backoff: Backoff = field(default_factory=lambda: Backoff.fixed("1s"))
    attempts: int | None = None
    retry_on: MatcherSpec | None = None
    not_retryable: MatcherSpec | None = None
    in_place: InPlace | None = None
    max_retry_period: Duration | None = None
    dead_letter: bool = True
    naming: Naming | str = Naming.PER_DELAY
    max_error_message_bytes: int = 1024
    max_error_trace_bytes: int = 8192
    header_format: HeaderFormat | str = HeaderFormat.REDRIVE
    dead_letter_limit: DeadLetterLimit | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backoff, Backoff):
            raise InvalidPolicy("backoff", self.backoff,
                                "must be a Backoff (Backoff.fixed/exponential/sequence/custom)")
        object.__setattr__(self, "attempts", self._resolve_attempts())
        object.__setattr__(self, "retry_on", as_matcher(self.retry_on, "retry_on", ANY_ERROR))
        object.__setattr__(self, "not_retryable",
                           as_matcher(self.not_retryable, "not_retryable", NO_ERROR))
        if self.in_place is not None and not isinstance(self.in_place, InPlace):
            raise InvalidPolicy("in_place", self.in_place, "must be an InPlace")
        period: int | None = None
        if self.max_retry_period is not None:
            period = to_ms(self.max_retry_period, "max_retry_period", InvalidPolicy)
            if period <= 0:
                raise InvalidPolicy("max_retry_period", self.max_retry_period, "must be positive")
            # A timedelta reads the same when the policy is made again from its fields
            # (dataclasses.replace): ms kept as an int would be read as seconds.
            object.__setattr__(self, "max_retry_period", timedelta(milliseconds=period))
        object.__setattr__(self, "_max_retry_period_ms", period)
        try:
            object.__setattr__(self, "naming", Naming(self.naming))
        except ValueError as exc:
            raise InvalidPolicy("naming", self.naming,
                                f"expected one of {[n.value for n in Naming]}") from exc
        try:
            object.__setattr__(self, "header_format", HeaderFormat(self.header_format))
        except ValueError as exc:
            raise InvalidPolicy("header_format", self.header_format,
                                f"expected one of {[f.value for f in HeaderFormat]}") from exc
        if self.dead_letter_limit is not None \
                and not isinstance(self.dead_letter_limit, DeadLetterLimit):
            raise InvalidPolicy("dead_letter_limit", self.dead_letter_limit,
                                "must be a DeadLetterLimit")
        if not isinstance(self.dead_letter, bool):
            raise InvalidPolicy("dead_letter", self.dead_letter, "must be True or False")
        for name in ("max_error_message_bytes", "max_error_trace_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidPolicy(name, value, "must be an integer >= 0")
        self._check_delays()

    def __hash__(self) -> int:
        # Hashed on every routed record (the topic plan's cache); the generated hash walks every
        # field down to the matchers. Cached per process, and left out of pickles, because hashes
        # of strings differ between processes (Spark's executors get the policy pickled).
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        return {name: value for name, value in self.__dict__.items() if name != "_hash"}

    def _resolve_attempts(self) -> int:
        implied = self.backoff.implied_attempts
        given = self.attempts
        if given is None:
            return implied if implied is not None else DEFAULT_ATTEMPTS
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise InvalidPolicy("attempts", given, "must be an integer >= 1 (the first delivery "
                                "counts)")
        if given > MAX_ATTEMPTS:
            raise InvalidPolicy("attempts", given, f"must be at most {MAX_ATTEMPTS} (to retry "
                                "until a time rather than a count, give max_retry_period)")
        if implied is not None and given != implied:
            raise InvalidPolicy("attempts", given, f"the backoff sequence implies {implied} "
                                f"({implied - 1} delays plus the first delivery)")
        return given

    def _check_delays(self) -> None:
        check_delays(self.backoff, self.max_attempts - 1, "backoff")

    @property
    def max_attempts(self) -> int:
        assert isinstance(self.attempts, int)
        return self.attempts

    @property
    def max_retry_period_ms(self) -> int | None:
        ms: int | None = self.__dict__["_max_retry_period_ms"]
        return ms

    @property
    def dead_letter_format(self) -> HeaderFormat:
        assert isinstance(self.header_format, HeaderFormat)
        return self.header_format

    @property
    def topic_naming(self) -> Naming:
        assert isinstance(self.naming, Naming)
        return self.naming

    def retry_delays_ms(self) -> list[int]:
        """The nominal delay before each retry, in order: one entry per retry."""
        return [self.backoff.nominal_ms(retry) for retry in range(1, self.max_attempts)]

    @property
    def routes_by_data(self) -> bool:
        """Whether an error's fate (retried or dead-lettered) follows from its data alone (see
        ErrorMatcher.reads_data_only), so that errors equal as data share one route."""
        assert isinstance(self.not_retryable, ErrorMatcher)
        assert isinstance(self.retry_on, ErrorMatcher)
        return self.not_retryable.reads_data_only and self.retry_on.reads_data_only

    def disposition(self, error: ErrorLike) -> Disposition:
        info = ErrorInfo.of(error)
        assert isinstance(self.not_retryable, ErrorMatcher)
        assert isinstance(self.retry_on, ErrorMatcher)
        if self.not_retryable.matches(info) or not self.retry_on.matches(info):
            return Disposition.DEAD_LETTER
        if self.in_place is not None and self.in_place.matcher.matches(info):
            return Disposition.IN_PLACE
        return Disposition.RETRY

    def describe(self) -> str:
        return f"{self.backoff.describe()}, attempts {self.max_attempts}"
