"""Plain-text tables for the CLI: aligned columns, readable in any terminal and in logs."""

from __future__ import annotations

from collections.abc import Sequence


def render(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in columns], *[["" if v is None else str(v) for v in row]
                                          for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
