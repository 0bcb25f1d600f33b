"""Error classifiers: small composable predicates over an error, combined with `|`, `&`, `~`.

They see an ErrorInfo, which carries the class names (with base classes) of the error and its
causes, so they work the same on a live exception and on an error shipped from a Spark executor.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from redrive.errors import InvalidPolicy
from redrive.record import ErrorInfo, qualified_name

ErrorLike = BaseException | ErrorInfo

log = logging.getLogger("redrive.policy")


class ErrorMatcher:
    def matches(self, error: ErrorInfo) -> bool:
        raise NotImplementedError

    @property
    def reads_data_only(self) -> bool:
        """Whether the answer follows from the ErrorInfo's data alone (names, message, trace),
        never from its live exception: then errors equal as data get the same answer, and a
        route may be decided once for them all. Not for a matcher of unknown make."""
        return False

    def __call__(self, error: ErrorLike) -> bool:
        return self.matches(ErrorInfo.of(error))

    def __or__(self, other: ErrorMatcher) -> ErrorMatcher:
        return AnyOf((self, other))

    def __and__(self, other: ErrorMatcher) -> ErrorMatcher:
        return AllOf((self, other))

    def __invert__(self) -> ErrorMatcher:
        return Not(self)


@dataclass(frozen=True)
class ByType(ErrorMatcher):
    """Errors that are instances of one of `names`, or caused by one.

    A qualified name (`myapp.errors.ParseError`) matches that class; a bare one (`ParseError`)
    matches a class of that name in any module, since a DataFrame transform's error column,
    a function shipped by value to executors (module `__main__`) and a JVM exception each spell
    the module differently, while users name the class.
    """

    names: frozenset[str]
    causes: bool = True

    def matches(self, error: ErrorInfo) -> bool:
        for kinds in error.kinds(causes=self.causes):
            if self.names.intersection(kinds):
                return True
            if any(kind.rpartition(".")[2] in self.names for kind in kinds):
                return True
        return False

    @property
    def reads_data_only(self) -> bool:
        return True


@dataclass(frozen=True)
class MessageMatches(ErrorMatcher):
    pattern: re.Pattern[str]

    def matches(self, error: ErrorInfo) -> bool:
        return self.pattern.search(error.message) is not None

    @property
    def reads_data_only(self) -> bool:
        return True


@dataclass(frozen=True)
class Predicate(ErrorMatcher):
    """The user's own test, given the ErrorInfo (its .exception is the live error, if any).

    A test that raises does not match, and says so once per kind of error it raised: it was
    written for some errors (`e.exception.response.status == 429`) and meets others (an error
    with no response, or shipped from a Spark executor without its live exception). Raised on,
    it would stop the runtime at that record, and again at every restart.
    """

    function: Callable[[ErrorInfo], bool]

    def matches(self, error: ErrorInfo) -> bool:
        try:
            return bool(self.function(error))
        except Exception as failed:
            seen = (id(self.function), type(failed))
            if seen not in _FAILED_PREDICATES and len(_FAILED_PREDICATES) < 1024:
                _FAILED_PREDICATES.add(seen)
                log.warning("the error predicate %r raised %s on %s (%s); it counts as not "
                            "matching", self.function, qualified_name(type(failed)),
                            error.type_name, failed)
            return False


_FAILED_PREDICATES: set[tuple[int, type[BaseException]]] = set()


@dataclass(frozen=True)
class AnyOf(ErrorMatcher):
    parts: tuple[ErrorMatcher, ...]

    def matches(self, error: ErrorInfo) -> bool:
        return any(part.matches(error) for part in self.parts)

    @property
    def reads_data_only(self) -> bool:
        return all(part.reads_data_only for part in self.parts)


@dataclass(frozen=True)
class AllOf(ErrorMatcher):
    parts: tuple[ErrorMatcher, ...]

    def matches(self, error: ErrorInfo) -> bool:
        return all(part.matches(error) for part in self.parts)

    @property
    def reads_data_only(self) -> bool:
        return all(part.reads_data_only for part in self.parts)


@dataclass(frozen=True)
class Not(ErrorMatcher):
    part: ErrorMatcher

    def matches(self, error: ErrorInfo) -> bool:
        return not self.part.matches(error)

    @property
    def reads_data_only(self) -> bool:
        return self.part.reads_data_only


@dataclass(frozen=True)
class Constant(ErrorMatcher):
    value: bool

    def matches(self, error: ErrorInfo) -> bool:
        return self.value

    @property
    def reads_data_only(self) -> bool:
        return True


ANY_ERROR = Constant(True)
NO_ERROR = Constant(False)


def error_type(*types: type[BaseException] | str, causes: bool = True) -> ByType:
    """Match by exception class, qualified class name or bare class name, subclasses included."""
    names: set[str] = set()
    for kind in types:
        if isinstance(kind, str) and kind:
            names.add(kind)
        elif isinstance(kind, type) and issubclass(kind, BaseException):
            names.add(qualified_name(kind))
        else:
            raise InvalidPolicy("error type", kind, "expected an exception class or its name")
    if not names:
        raise InvalidPolicy("error type", types, "name at least one exception class")
    return ByType(frozenset(names), causes)


def message_matches(pattern: str) -> MessageMatches:
    try:
        return MessageMatches(re.compile(pattern))
    except re.error as exc:
        raise InvalidPolicy("message pattern", pattern, str(exc)) from exc


def predicate(function: Callable[[ErrorInfo], bool]) -> Predicate:
    if not callable(function):
        raise InvalidPolicy("predicate", function, "must be callable")
    return Predicate(function)


MatcherSpec = ErrorMatcher | type[BaseException] | str | Iterable[type[BaseException] | str]


def as_matcher(spec: MatcherSpec | None, field: str, default: ErrorMatcher) -> ErrorMatcher:
    """Accept a matcher, an exception class, a class name, or a list of those."""
    if spec is None:
        return default
    if isinstance(spec, ErrorMatcher):
        return spec
    if isinstance(spec, str | type):
        items: list[type[BaseException] | str] = [spec]
    elif isinstance(spec, Iterable):
        items = list(spec)
    else:
        raise InvalidPolicy(field, spec, "expected an ErrorMatcher, exception classes or class "
                            "names")
    try:
        return error_type(*items)
    except InvalidPolicy as exc:
        raise InvalidPolicy(field, spec, "expected an ErrorMatcher, exception classes or "
                            "class names") from exc
