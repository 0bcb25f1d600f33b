"""The delay tiers and the choice of the next hop: pure, no I/O.

A tier is a topic on which every record waits the same time, counted from the moment it was
written there (its timestamp). Due times therefore rise with offsets, and pausing a partition at the
first record that is not due yet is exact. An arbitrary delay is served like a hierarchical timing
wheel: each hop goes to the largest tier not exceeding the time that remains, so no hop ever ends
after the final due time, and the record reaches its target once that time has come.

The one exception is the last stretch: when less than the smallest tier remains, the record takes a
smallest-tier hop whose gate stops at its final due time instead of the hop's end (see `hop_due`).
On the partition of that tier it may still wait behind earlier records, each of which is due at the
latest one smallest tier after it was written. Delays in earlier hops are absorbed, since each hop
is chosen from the time that actually remains. So the bound is:

    due <= delivered < due + smallest tier + L

where L is the service's own latency for one hop (fetch wait of at most 50 ms, the poll, the
transaction commit). A record alone on its partition arrives within L of its due time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from redrive.errors import InvalidArgument
from redrive.policy.duration import Duration, format_ms, to_ms
from redrive.topics import SEPARATOR, check_name

DEFAULT_PREFIX = "redrive.delay"
DEFAULT_DURATIONS: tuple[str, ...] = ("1s", "10s", "1m", "10m", "1h")
DEAD_LETTER_SUFFIX = "dlt"
# A tier topic's suffix: its delay as format_ms spells it.
_DELAY = re.compile(r"[0-9]+(?:ms|s|m|h|d)")


@dataclass(frozen=True)
class Tier:
    topic: str
    delay_ms: int


@dataclass(frozen=True)
class Tiers:
    """A fixed set of delay tiers, smallest first, with their topics and dead-letter topic."""

    tiers: tuple[Tier, ...]
    prefix: str
    dead_letter: str

    @classmethod
    def of(cls, durations: Iterable[Duration] = DEFAULT_DURATIONS,
           prefix: str = DEFAULT_PREFIX) -> Tiers:
        check_name("tier prefix", prefix)
        if isinstance(durations, str):
            # Read one character at a time, "15" made tiers of 1 s and 5 s.
            raise InvalidArgument("tiers", durations, "give a list of durations, or parse a "
                                  "string with Tiers.parse('1s,1m,1h')")
        delays: list[int] = []
        for duration in durations:
            ms = to_ms(duration, "tier")
            if ms <= 0:
                raise InvalidArgument("tier", duration, "must be longer than 0 ms")
            if ms in delays:
                raise InvalidArgument("tier", duration, f"{format_ms(ms)} is given twice")
            delays.append(ms)
        if not delays:
            raise InvalidArgument("tiers", list(durations), "need at least one tier")
        ordered = sorted(delays)
        tiers = tuple(Tier(check_name("tier topic", SEPARATOR.join((prefix, format_ms(ms)))), ms)
                      for ms in ordered)
        return cls(tiers, prefix, check_name("dead-letter topic",
                                             SEPARATOR.join((prefix, DEAD_LETTER_SUFFIX))))

    @classmethod
    def parse(cls, text: str, prefix: str = DEFAULT_PREFIX) -> Tiers:
        """Tiers from a comma-separated list such as `100ms,1s,5s` (the CLI's form)."""
        parts = [part.strip() for part in text.split(",")]
        if not text.strip() or any(not part for part in parts):
            raise InvalidArgument("tiers", text, "expected durations separated by commas, "
                                               "such as 1s,10s,1m")
        return cls.of(parts, prefix)

    @property
    def smallest_ms(self) -> int:
        return self.tiers[0].delay_ms

    @property
    def topics(self) -> list[str]:
        return [tier.topic for tier in self.tiers]

    @property
    def waits(self) -> dict[str, int]:
        """Each tier's topic with the longest a record waits there (ms): the tier's delay."""
        return {tier.topic: tier.delay_ms for tier in self.tiers}

    @property
    def owned_topics(self) -> list[str]:
        """Every topic of the service: a record must never be scheduled back into one of them."""
        return [*self.topics, self.dead_letter]

    def named_on(self, existing: Iterable[str]) -> dict[str, Tier]:
        """The topics of `existing` named as this prefix's tiers (`<prefix>.<delay>`) that are
        not among these tiers: those of another set of tiers with the same prefix."""
        found: dict[str, Tier] = {}
        start = self.prefix + SEPARATOR
        for name in existing:
            suffix = name[len(start):] if name.startswith(start) else ""
            if not _DELAY.fullmatch(suffix) or name in self.topics:
                continue
            delay_ms = to_ms(suffix, "tier")
            if delay_ms > 0:
                found[name] = Tier(name, delay_ms)
        return found

    def by_topic(self, topic: str) -> Tier:
        for tier in self.tiers:
            if tier.topic == topic:
                return tier
        raise InvalidArgument("tier topic", topic, f"not one of {self.topics}")

    def next_hop(self, remaining_ms: int) -> Tier | None:
        """Where a record goes with `remaining_ms` left: None means to its target, now.

        The largest tier not exceeding the time left; the smallest tier when less than it is left.
        """
        if remaining_ms <= 0:
            return None
        chosen = self.tiers[0]
        for tier in self.tiers:
            if tier.delay_ms <= remaining_ms:
                chosen = tier
        return chosen


def hop_due(written_ms: int, tier_delay_ms: int, final_due_ms: int) -> int:
    """When the gate may let a record off a tier: its hop's end, or its final due if earlier.

    Only a last-stretch record on the smallest tier has a final due before its hop's end; stopping
    there keeps it from a whole extra smallest-tier wait when it reaches the head of its partition.
    """
    return min(written_ms + tier_delay_ms, final_due_ms)


DEFAULT_TIERS = Tiers.of()
