"""The README's layout table holds: every module of the package is in one of its rows, and each
imports only modules of its own row or of rows above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "redrive"
ROW = re.compile(r"^\| ((?:`[^`]+`(?:, )?)+) \|", re.M)


def rows() -> dict[str, int]:
    """Each room the table names (`consumer`, `errors`) and its row, 0 at the top."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| room |", text.index("### Layout")):]
    table = table.split("\n\n")[0]
    found: dict[str, int] = {}
    for index, match in enumerate(ROW.finditer(table)):
        for name in re.findall(r"`([^`]+)`", match.group(1)):
            found[name.removesuffix("/").removesuffix(".py")] = index
    return found


def room_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def imported_rooms(path: Path) -> set[str]:
    """The rooms a module imports from: `import redrive.x`, `from redrive.x import y`,
    `from redrive import x` and relative imports alike."""
    package = ["redrive", *path.relative_to(PACKAGE).parent.parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            dotted = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = [*base, *(node.module or "").split(".")] if node.module else base
            # `from redrive import x` names rooms; `from redrive.x import y` names x's members.
            dotted = ([[*module, alias.name] for alias in node.names] if len(module) == 1
                      else [module])
        else:
            continue
        found.update(parts[1] for parts in dotted if parts[0] == "redrive" and len(parts) > 1)
    return found


def modules() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if room_of(path) not in ("__init__", "__main__")]


def test_every_room_of_the_package_is_in_the_table() -> None:
    table = rows()
    missing = sorted({room_of(path) for path in modules()} - set(table))
    assert not missing, f"rooms the README's layout table leaves out: {missing}"


def test_imports_go_up_the_table_never_down() -> None:
    table = rows()
    against = [f"{path.relative_to(PACKAGE)} imports {target} (row {table[target]}, below "
               f"row {table[room_of(path)]})"
               for path in modules() for target in sorted(imported_rooms(path))
               if target in table and table[target] > table[room_of(path)]]
    assert not against, "\n".join(against)
