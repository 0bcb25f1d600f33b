"""The data types every runtime shares: a consumed record and the retry history it carries."""

from __future__ import annotations

import functools
import inspect
import linecache
from dataclasses import dataclass, field, fields
from types import CodeType, TracebackType
from typing import Any


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a record was first consumed from, before any retry copy was made."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """What redrive knows about a record's history, read from its headers."""

    attempt: int = 0
    first_failure_ms: int | None = None
    group: str | None = None
    original: Origin | None = None
    due_ms: int | None = None
    target: str | None = None


class _RecordSlots:
    """Record's storage. Its slots live in this plain base so that a Record can be built by
    plain attribute stores on a `RecordDraft` instance whose class is then switched to Record:
    a frozen dataclass's own __init__ pays an object.__setattr__ call per field (~0.7 µs for a
    Record, on the path of every consumed record)."""

    __slots__ = ("delivery", "headers", "key", "offset", "partition", "timestamp_ms", "topic",
                 "value")


class RecordDraft(_RecordSlots):
    """A Record being built: `RecordDraft()`, a plain store to each of Record's eight fields,
    then `draft.__class__ = Record`. For a runtime's per-record loop, where even the call of
    `new_record` shows; anywhere else use `new_record` or `Record(...)`."""

    __slots__ = ()


NO_HISTORY = Delivery()


@dataclass(frozen=True)
class Record(_RecordSlots):
    """A consumed record as handlers and routing see it, in every runtime.

    Frozen like a dataclass(frozen=True): assigning a field raises FrozenInstanceError.
    """

    __slots__ = ()

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    delivery: Delivery = field(default_factory=Delivery)

    def origin(self) -> Origin:
        """Where the record was first consumed: its headers say so for a copy, else itself."""
        if self.delivery.original is not None:
            return self.delivery.original
        return Origin(self.topic, self.partition, self.offset, self.timestamp_ms)

    # Pickled as dataclass(slots=True) does: the field values in field order.
    def __getstate__(self) -> list[object]:
        return [getattr(self, name) for name in _FIELDS]

    def __setstate__(self, state: list[object]) -> None:
        for name, value in zip(_FIELDS, state, strict=True):
            object.__setattr__(self, name, value)


_FIELDS = tuple(f.name for f in fields(Record))


def _builders() -> tuple[Any, Any]:
    # Closures, so that the names they use are cell loads rather than global lookups.
    unset: Any = object()
    set_attr = object.__setattr__
    building_type = RecordDraft
    record_type = Record
    no_history = NO_HISTORY

    def __init__(self: Record, topic: str, partition: int, offset: int, timestamp_ms: int,
                 key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]] = unset,
                 delivery: Delivery = unset) -> None:
        building: Any = self
        set_attr(self, "__class__", building_type)
        building.topic = topic
        building.partition = partition
        building.offset = offset
        building.timestamp_ms = timestamp_ms
        building.key = key
        building.value = value
        building.headers = [] if headers is unset else headers
        building.delivery = no_history if delivery is unset else delivery
        building.__class__ = record_type

    def new_record(topic: str, partition: int, offset: int, timestamp_ms: int,
                   key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]],
                   delivery: Delivery) -> Record:
        """Record(...) with every field given, without the constructor call's overhead: the
        runtimes build one per consumed record."""
        # Calling the class is cheaper than object.__new__(class), which goes through a wrapper.
        record: Any = building_type()
        record.topic = topic
        record.partition = partition
        record.offset = offset
        record.timestamp_ms = timestamp_ms
        record.key = key
        record.value = value
        record.headers = headers
        record.delivery = delivery
        record.__class__ = record_type
        return record  # type: ignore[no-any-return]

    __init__.__signature__ = inspect.signature(Record.__init__)  # type: ignore[attr-defined]
    __init__.__qualname__ = "Record.__init__"
    return __init__, new_record


Record.__init__, new_record = _builders()  # type: ignore[method-assign]


@dataclass(frozen=True)
class ErrorInfo:
    """An error as data, so that Spark executors can hand it to the driver.

    `chain` holds, for the error and then each of its causes, the qualified names of its class
    and base classes, so that classifiers match subclasses and causes on data as on exceptions.
    `exception` is the live exception where one exists (not pickled, not compared). The texts
    are always UTF-8-encodable (see `encodable`): they become headers and Arrow strings.
    """

    type_name: str
    message: str
    trace: str = ""
    chain: tuple[tuple[str, ...], ...] = ()
    exception: BaseException | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("type_name", "message", "trace"):
            text = getattr(self, name)
            if not text.isascii():
                object.__setattr__(self, name, encodable(text))

    @classmethod
    def from_exception(cls, error: BaseException) -> ErrorInfo:
        errors = _cause_chain(error)
        chain = tuple(_kind_names(type(current)) for current in errors)
        return cls(qualified_name(type(error)), error_text(error), format_trace(errors), chain,
                   error)

    def detached(self) -> ErrorInfo:
        """The same data without the live exception.

        What a caller keeps after classifying: a live exception's traceback holds the frame that
        caught it, so an ErrorInfo kept in that frame's locals makes a reference cycle that only
        the cyclic collector frees, with every local of every frame on the traceback (a batch's
        rows, say). Spark tasks that failed many records spent most of their time in it.
        """
        return ErrorInfo(self.type_name, self.message, self.trace, self.chain)

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


def _cause_chain(error: BaseException) -> list[BaseException]:
    """The error, then what caused it (explicitly or while handling), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return chain


def format_trace(chain: list[BaseException]) -> str:
    """A traceback in Python's own layout, without the error-location carets.

    traceback.format_exception re-parses each frame's source to place its carets, which costs
    tens of microseconds per frame: too much on the path of every failed record.
    """
    parts: list[str] = []
    for index, error in enumerate(reversed(chain)):
        if index:
            parts.append("\nThe above exception was the direct cause of the following "
                         "exception:\n\n" if error.__cause__ is not None else
                         "\nDuring handling of the above exception, another exception "
                         "occurred:\n\n")
        if error.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            entry: TracebackType | None = error.__traceback__
            while entry is not None:  # traceback.walk_tb's walk, without its generator
                parts.append(_frame_text(entry.tb_frame.f_code, entry.tb_lineno))
                entry = entry.tb_next
        message = error_text(error)
        name = qualified_name(type(error))
        parts.append(f"{name}: {message}\n" if message else f"{name}\n")
    return "".join(parts)


def error_text(error: BaseException) -> str:
    """str(error), or, when its __str__ itself raises, a text saying so: the failed record must
    still be routed, not end the runtime with the error of its error."""
    try:
        return str(error)
    except Exception as failed:
        return f"<str() of the error failed: {qualified_name(type(failed))}>"


def encodable(text: str) -> str:
    """`text` with what UTF-8 cannot hold written as escapes: lone surrogates, which a message
    or a file name decoded from bytes with surrogateescape carries (`\\udcff`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# A failing handler fails at the same few places again and again: the text of a frame and the
# class names of an error type are worked out once each.
@functools.lru_cache(maxsize=4096)
def _frame_text(code: CodeType, line_number: int) -> str:
    text = f'  File "{code.co_filename}", line {line_number}, in {code.co_name}\n'
    line = linecache.getline(code.co_filename, line_number).strip()
    return f"{text}    {line}\n" if line else text


_KIND_NAMES: dict[type, tuple[str, ...]] = {}


def _kind_names(kind: type) -> tuple[str, ...]:
    """The qualified names of a class and its bases, for classifiers matching by name."""
    names = _KIND_NAMES.get(kind)
    if names is None:
        names = tuple(qualified_name(base) for base in kind.__mro__ if base is not object)
        if len(_KIND_NAMES) < 1024:  # classes made on the fly must not grow it without end
            _KIND_NAMES[kind] = names
    return names


def qualified_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
