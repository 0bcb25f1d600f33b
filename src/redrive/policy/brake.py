"""A dead-letter brake: how many dead letters a partition may produce before it stops.

A bad deploy or a broken dependency can send a whole stream to the dead-letter topic in minutes.
With a limit, the runtime pauses the partition at the record that would pass it instead of
dead-lettering it, and waits for an operator (`redrive resume`) or the cool-off. A `Window`
holds one partition's recent outcomes, as runs of one outcome rather than one entry per record
(successes come in runs: counting costs the same for a run of any length).

    DeadLetterLimit(ratio=0.5, window=1000)          # more than half of the last 1000 records
    DeadLetterLimit(consecutive=100, cool_off="5m")  # more than 100 in a row; retry in 5 minutes
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import timedelta

from redrive.errors import InvalidPolicy
from redrive.policy.duration import Duration, to_ms


@dataclass(frozen=True)
class DeadLetterLimit:
    """ratio: the largest share of dead letters among a partition's last `window` finished
    records (retries not counted) allowed; judged only once `window` records are in view.
    consecutive: the most dead letters in a row allowed. cool_off: resume by itself after this
    long (None: only `redrive resume` releases the partition)."""

    ratio: float | None = None
    window: int = 1000
    consecutive: int | None = None
    cool_off: Duration | None = None

    def __post_init__(self) -> None:
        if self.ratio is None and self.consecutive is None:
            raise InvalidPolicy("dead_letter_limit", self, "give ratio, consecutive or both")
        if self.ratio is not None and (isinstance(self.ratio, bool)
                                       or not isinstance(self.ratio, int | float)
                                       or not 0 <= self.ratio < 1):
            raise InvalidPolicy("dead_letter_limit.ratio", self.ratio,
                                "must be a number from 0 up to (not including) 1")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise InvalidPolicy("dead_letter_limit.window", self.window,
                                "must be an integer >= 1")
        if self.consecutive is not None and (isinstance(self.consecutive, bool)
                                             or not isinstance(self.consecutive, int)
                                             or self.consecutive < 0):
            raise InvalidPolicy("dead_letter_limit.consecutive", self.consecutive,
                                "must be an integer >= 0")
        if self.cool_off is not None:
            ms = to_ms(self.cool_off, "dead_letter_limit.cool_off", InvalidPolicy)
            if ms <= 0:
                raise InvalidPolicy("dead_letter_limit.cool_off", self.cool_off,
                                    "must be positive")
            # Kept as a timedelta, which reads the same when the limit is made again from its
            # fields (dataclasses.replace): ms kept as an int would be read as seconds.
            object.__setattr__(self, "cool_off", timedelta(milliseconds=ms))
        object.__setattr__(self, "_cool_off_ms", None if self.cool_off is None else ms)

    @property
    def cool_off_ms(self) -> int | None:
        ms: int | None = self.__dict__["_cool_off_ms"]
        return ms

    def describe(self) -> str:
        parts = []
        if self.ratio is not None:
            parts.append(f"more than {self.ratio:g} of the last {self.window}")
        if self.consecutive is not None:
            parts.append(f"more than {self.consecutive} in a row")
        return " or ".join(parts)


class Window:
    """One partition's recent outcomes: at most `size` of them, oldest dropped first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._runs: deque[list[int]] = deque()  # [count, 1 if dead letters else 0]
        self.total = 0
        self.dead = 0
        self.in_a_row = 0

    def copy(self) -> Window:
        twin = Window(self.size)
        twin._runs = deque([run[:] for run in self._runs])
        twin.total, twin.dead, twin.in_a_row = self.total, self.dead, self.in_a_row
        return twin

    def add(self, count: int, dead: bool) -> None:
        flag = int(dead)
        if self._runs and self._runs[-1][1] == flag:
            self._runs[-1][0] += count
        else:
            self._runs.append([count, flag])
        self.total += count
        if dead:
            self.dead += count
            self.in_a_row += count
        else:
            self.in_a_row = 0
        excess = self.total - self.size
        while excess > 0:
            run = self._runs[0]
            taken = min(run[0], excess)
            run[0] -= taken
            self.total -= taken
            self.dead -= taken * run[1]
            excess -= taken
            if not run[0]:
                self._runs.popleft()

    def passes(self, limit: DeadLetterLimit) -> bool:
        """Whether one more dead letter would pass `limit`."""
        if limit.consecutive is not None and self.in_a_row + 1 > limit.consecutive:
            return True
        if limit.ratio is None:
            return False
        total, dead = self.total + 1, self.dead + 1
        if total > self.size:  # the oldest outcome leaves the window
            total -= 1
            dead -= self._runs[0][1]
        return total >= self.size and dead > limit.ratio * total
