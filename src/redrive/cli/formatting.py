"""How the commands show things: tables, ages, times, byte previews, dead-letter records.

Tables are drawn by tabulate in its `simple` layout: aligned columns under a dashed rule, readable
in any terminal and in logs, and split on whitespace by scripts.

What a record holds reaches a terminal with its control characters written out (`\x1b`, `\n`):
as they are, a key or an error message could clear the screen, retitle the terminal, or print
lines that pass for the command's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from tabulate import tabulate

from redrive.dead_letter_headers import header_sets, header_text
from redrive.ops.deadletters import DeadLetterRecord, text

PREVIEW_CHARS = 40
_WRITTEN_OUT = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7f, *range(0x80, 0xa0))}
_WRITTEN_OUT.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def shown(text_: str) -> str:
    """Text for a terminal, its control characters written out (see the module)."""
    return text_.translate(_WRITTEN_OUT)


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under their column names; None shows as an empty cell, numbers as they are."""
    return str(tabulate([[shown(cell) if isinstance(cell, str) else cell for cell in row]
                         for row in rows], headers=list(columns), tablefmt="simple",
                        disable_numparse=True, missingval=""))


def age(ms: int) -> str:
    """A duration as people read it: 250ms, 5s, 1m01s, 2h01m, 1d01h."""
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s" if seconds else f"{ms}ms"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def since(at_ms: int, now_ms: int) -> str:
    """How long ago `at_ms` was (never negative)."""
    return age(max(0, now_ms - at_ms))


def relative(at_ms: int, now_ms: int) -> str:
    """A time before or after now: `in 5s`, `2m03s ago`."""
    delta = at_ms - now_ms
    return f"in {age(delta)}" if delta > 0 else f"{age(-delta)} ago"


def iso(ms: int | None) -> str:
    """Epoch milliseconds as an ISO time in UTC, to the millisecond; empty for None."""
    if ms is None:
        return ""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError):  # a time a producer stamped past the years 1 to 9999
        return f"{ms} ms"


def preview(data: bytes | None, width: int = PREVIEW_CHARS) -> str:
    """The start of a key or value as text, cut to `width` characters."""
    shown = text(data) or ""
    return shown if len(shown) <= width else shown[:width - 1] + "…"


# --- dead-letter records -----------------------------------------------------------------------

SUMMARY_COLUMNS = ["record", "key", "age", "reason", "system", "error", "message", "attempts",
                   "original"]


def summary_row(letter: DeadLetterRecord, at_ms: int,
                message_width: int = 60) -> list[object]:
    """One line of `dlt ls`: where, key, age, why, and where the record first came from."""
    record, info = letter.record, letter.info
    origin = info.original if info else None
    message = letter.problem if letter.problem else (letter.error_message or "")
    message = " ".join(message.split())
    if len(message) > message_width:
        message = message[:message_width - 1] + "…"
    return [
        letter.coordinates,
        text(record.key) or "",
        since(record.timestamp_ms, at_ms),
        "UNREADABLE" if letter.problem else (letter.reason or "-"),
        letter.system or "-",
        letter.error_type or "",
        message,
        "" if info is None or info.attempts is None else info.attempts,
        "" if origin is None else f"{origin.topic}[{origin.partition}]@{origin.offset}",
    ]


def detail(letter: DeadLetterRecord, at_ms: int) -> str:
    """Everything about one record: its story, its payload and every header, as text."""
    record, info = letter.record, letter.info
    lines = [
        f"record:     {record.topic} {letter.coordinates}",
        f"timestamp:  {iso(record.timestamp_ms)} ({since(record.timestamp_ms, at_ms)} ago)",
        f"key:        {text(record.key)}",
    ]
    if letter.problem:
        lines.append(f"UNREADABLE: {letter.problem}")
    if info is not None:
        origin = info.original
        lines += [
            f"written by: {' + '.join(header_sets(record.headers))}",
            f"reason:     {info.reason or '-'}",
            f"group:      {info.group or '-'}",
            f"attempts:   {'-' if info.attempts is None else info.attempts}",
            "original:   " + ("-" if origin is None else
                              f"{origin.topic} {origin.partition}:{origin.offset}"
                              + ("" if origin.timestamp_ms is None
                                 else f" at {iso(origin.timestamp_ms)}")),
            f"error:      {info.error_type or '-'}",
            f"message:    {info.error_message or '-'}",
        ]
    lines.append(f"value:      {text(record.value)}")
    lines.append("headers:")
    lines += [f"  {name}: {_header_text(name, value)}" for name, value in record.headers]
    trace = info.error_trace if info else None
    if trace:
        lines.append("trace:")
        lines += ["  " + line for line in trace.rstrip().split("\n")]
    return "\n".join(shown(line) for line in lines)


def _header_text(name: str, value: bytes | None) -> str:
    readable = header_text(name, value)
    if "stacktrace" in name or name.endswith("trace"):
        first = readable.splitlines()[0] if readable else ""
        return f"{first} … (trace below)" if "\n" in readable else readable
    return readable
