"""Backoff schedules: how long to wait before each retry.

A schedule is a small object answering `delay_ms(n)` for the n-th retry (1-based). `nominal_ms(n)`
is the delay without jitter: records of one retry topic share it, so the topic can be named by it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from redrive.errors import InvalidPolicy
from redrive.policy.duration import Duration, format_ms, to_ms


class Backoff:
    """Base of every schedule; also the namespace of the constructors users call."""

    def nominal_ms(self, retry: int) -> int:
        raise NotImplementedError

    def delay_ms(self, retry: int) -> int:
        return self.nominal_ms(retry)

    def longest_ms(self, retry: int) -> int:
        """The longest delay_ms(retry) can be (its nominal one, but for jitter)."""
        return self.nominal_ms(retry)

    @property
    def implied_attempts(self) -> int | None:
        """Total deliveries the schedule itself allows, if it has a fixed length."""
        return None

    def describe(self) -> str:
        raise NotImplementedError

    @staticmethod
    def fixed(delay: Duration) -> Fixed:
        return Fixed(to_ms(delay, "backoff.delay", InvalidPolicy))

    @staticmethod
    def exponential(initial: Duration = "1s", multiplier: float = 2.0,
                    max: Duration | None = None, jitter: float = 0.0) -> Exponential:
        return Exponential(
            to_ms(initial, "backoff.initial", InvalidPolicy), multiplier,
            None if max is None else to_ms(max, "backoff.max", InvalidPolicy), jitter)

    @staticmethod
    def sequence(delays: str | Sequence[Duration]) -> Explicit:
        if isinstance(delays, str):
            parts: Sequence[Duration] = [p for p in delays.split(",")]
        else:
            parts = delays
        if not parts or (isinstance(delays, str) and not delays.strip()):
            raise InvalidPolicy("backoff.sequence", delays, "needs at least one delay")
        return Explicit(tuple(to_ms(p.strip() if isinstance(p, str) else p,
                                    f"backoff.sequence[{i}]", InvalidPolicy)
                              for i, p in enumerate(parts)))

    @staticmethod
    def custom(function: Callable[[int], Duration], name: str = "custom") -> Custom:
        return Custom(function, name)

    @staticmethod
    def parse(text: str) -> Backoff:
        """A schedule from one string, as the CLI takes it: `5s` (fixed) or `5m,5m,30m`."""
        return Backoff.sequence(text) if "," in text else Backoff.fixed(text)


def _check_retry(retry: int) -> None:
    if retry < 1:
        raise InvalidPolicy("retry", retry, "retries are numbered from 1")


@dataclass(frozen=True)
class Fixed(Backoff):
    delay: int

    def __post_init__(self) -> None:
        if self.delay < 0:
            raise InvalidPolicy("backoff.delay", self.delay, "must not be negative")

    def nominal_ms(self, retry: int) -> int:
        _check_retry(retry)
        return self.delay

    def describe(self) -> str:
        return f"fixed {format_ms(self.delay)}"


@dataclass(frozen=True)
class Exponential(Backoff):
    """initial * multiplier**(n-1), capped at `max`; jitter spreads each delay by up to ±jitter.

    Jitter only ever shifts a due time within one retry topic, so the due gate still never admits
    a record early: a record behind a later-due head waits for it (at most the jitter).
    """

    initial: int
    multiplier: float = 2.0
    max: int | None = None
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("multiplier", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidPolicy(f"backoff.{name}", value, "must be a number")
        if self.initial <= 0:
            raise InvalidPolicy("backoff.initial", self.initial, "must be positive")
        if not 1.0 <= self.multiplier < math.inf:
            raise InvalidPolicy("backoff.multiplier", self.multiplier, "must be >= 1.0 and finite")
        if self.max is not None and self.max < self.initial:
            raise InvalidPolicy("backoff.max", self.max, f"must be >= initial ({self.initial})")
        if not 0.0 <= self.jitter < 1.0:
            raise InvalidPolicy("backoff.jitter", self.jitter, "must be in [0, 1)")

    def nominal_ms(self, retry: int) -> int:
        _check_retry(retry)
        try:
            delay = self.initial * self.multiplier ** (retry - 1)
        except OverflowError:  # float's power raises where its product would be inf
            delay = math.inf
        if self.max is not None:
            delay = min(delay, self.max)
        if delay == math.inf:
            raise InvalidPolicy(f"backoff({retry})", self.describe(),
                                "grows past any duration: cap it with max=")
        return round(delay)

    def delay_ms(self, retry: int) -> int:
        nominal = self.nominal_ms(retry)
        if not self.jitter:
            return nominal
        return max(0, round(nominal * (1 + self.rng.uniform(-self.jitter, self.jitter))))

    def longest_ms(self, retry: int) -> int:
        return math.ceil(self.nominal_ms(retry) * (1 + self.jitter))

    def describe(self) -> str:
        cap = f" max {format_ms(self.max)}" if self.max is not None else ""
        jitter = f" jitter {self.jitter:g}" if self.jitter else ""
        return f"exponential {format_ms(self.initial)} x{self.multiplier:g}{cap}{jitter}"


@dataclass(frozen=True)
class Explicit(Backoff):
    """An explicit list of delays, one per retry; its length fixes the number of attempts."""

    delays: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.delays:
            raise InvalidPolicy("backoff.sequence", self.delays, "needs at least one delay")

    def nominal_ms(self, retry: int) -> int:
        _check_retry(retry)
        if retry > len(self.delays):
            raise InvalidPolicy("retry", retry,
                                f"the sequence has only {len(self.delays)} delays")
        return self.delays[retry - 1]

    @property
    def implied_attempts(self) -> int:
        return len(self.delays) + 1

    def describe(self) -> str:
        return "sequence " + ",".join(format_ms(d) for d in self.delays)


@dataclass(frozen=True)
class Custom(Backoff):
    """Delays from the user's callable: retry number (1-based) -> duration."""

    function: Callable[[int], Duration]
    name: str = "custom"

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise InvalidPolicy("backoff.custom", self.function,
                                "must be a function from the retry number to a duration")

    def nominal_ms(self, retry: int) -> int:
        _check_retry(retry)
        return to_ms(self.function(retry), f"backoff.{self.name}({retry})", InvalidPolicy)

    def describe(self) -> str:
        return self.name
