"""How the console shows a record's value: JSON pretty-printed, other text as it is, bytes that
are not UTF-8 in hex, and JSON nested past what the parser goes as text, not a failed page."""

from __future__ import annotations

from redrive.ops.console import value_view


def test_values_are_shown_as_json_text_or_hex() -> None:
    assert value_view(b'{"id": 7}') == ("json", '{\n  "id": 7\n}')
    assert value_view(b"plain words") == ("text", "plain words")
    assert value_view(b"\xff\x00") == ("hex", "ff 00")
    assert value_view(None) == ("text", "")


def test_json_nested_deeper_than_the_parser_goes_is_shown_as_text() -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    assert value_view(nested) == ("text", nested.decode())
