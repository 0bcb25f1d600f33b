"""The data types every runtime shares: a consumed record and the retry history it carries."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Origin:
    """Where a record was first consumed from, before any retry copy was made."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Delivery:
    """What redrive knows about a record's history, read from its headers."""

    attempt: int = 0
    first_failure_ms: int | None = None
    group: str | None = None
    original: Origin | None = None
    due_ms: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class Record:
    """A consumed record as handlers and routing see it, in every runtime."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    delivery: Delivery = field(default_factory=Delivery)

    def origin(self) -> Origin:
        """Where the record was first consumed: its headers say so for a copy, else itself."""
        if self.delivery.original is not None:
            return self.delivery.original
        return Origin(self.topic, self.partition, self.offset, self.timestamp_ms)


@dataclass(frozen=True)
class ErrorInfo:
    """An error as data, so that Spark executors can hand it to the driver.

    `chain` holds, for the error and then each of its causes, the qualified names of its class
    and base classes, so that classifiers match subclasses and causes on data as on exceptions.
    `exception` is the live exception where one exists (not pickled, not compared).
    """

    type_name: str
    message: str
    trace: str = ""
    chain: tuple[tuple[str, ...], ...] = ()
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_exception(cls, error: BaseException) -> ErrorInfo:
        chain: list[tuple[str, ...]] = []
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            chain.append(tuple(qualified_name(kind) for kind in type(current).__mro__
                               if kind is not object))
            current = current.__cause__ or current.__context__
        trace = "".join(traceback.format_exception(error))
        return cls(qualified_name(type(error)), str(error), trace, tuple(chain), error)

    @classmethod
    def of(cls, error: BaseException | ErrorInfo) -> ErrorInfo:
        return error if isinstance(error, ErrorInfo) else cls.from_exception(error)

    def kinds(self, *, causes: bool = True) -> tuple[tuple[str, ...], ...]:
        """Class names of the error (and of its causes), each with its base classes."""
        chain = self.chain or ((self.type_name,),)
        return chain if causes else chain[:1]

    def __getstate__(self) -> dict[str, object]:
        # Exceptions may not pickle; the driver needs only the data.
        state = dict(self.__dict__)
        state["exception"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def qualified_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
