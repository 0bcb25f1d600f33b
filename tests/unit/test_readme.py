"""The README's examples stay true to the code: a new user copies them first.

Each Python example must compile, import only names that exist, and call redrive's functions and
classes with arguments their signatures accept (names defined by the user, such as `spark` or
`handle`, are left alone). Each `redrive ...` command line must parse with the CLI, options and
their values included, with the environment the example exports.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from redrive.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(language: str) -> list[tuple[int, str]]:
    """The README's fenced blocks of `language` ("" for unmarked), with their first line."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 2, match.group(2))
            for match in FENCE.finditer(text) if match.group(1) == language]


# --- Python examples ---------------------------------------------------------------------------


def imported(tree: ast.Module) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.module is not None
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
                names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = importlib.import_module(alias.name)
    return names


def resolved(func: ast.expr, names: dict[str, Any]) -> Any | None:
    """The object a call's function names, where it is an imported name or an attribute path
    from one (`Backoff.fixed`); None for anything else (a user's variable, a call's result)."""
    if isinstance(func, ast.Name):
        return names.get(func.id)
    if isinstance(func, ast.Attribute):
        owner = resolved(func.value, names)
        if owner is not None:
            assert hasattr(owner, func.attr), f"{owner!r} has no attribute {func.attr}"
            return getattr(owner, func.attr)
    return None


def redrive_calls(tree: ast.Module, names: dict[str, Any]) -> Iterator[tuple[ast.Call, Any]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = resolved(node.func, names)
            if target is not None and getattr(target, "__module__", "").startswith("redrive"):
                yield node, target


def test_the_readme_has_python_examples() -> None:
    assert len(blocks("python")) >= 10


def test_each_python_example_imports_and_calls_what_exists() -> None:
    names: dict[str, Any] = {}  # a block may use what an earlier block imported
    checked = 0
    for line, source in blocks("python"):
        tree = ast.parse(source, filename=f"README.md:{line}")
        names.update(imported(tree))
        for call, target in redrive_calls(tree, names):
            if any(isinstance(arg, ast.Starred) for arg in call.args) \
                    or any(keyword.arg is None for keyword in call.keywords):
                continue
            signature = inspect.signature(target)
            try:
                signature.bind(*call.args, **{k.arg: k.value for k in call.keywords
                                              if k.arg is not None})
            except TypeError as exc:
                pytest.fail(f"README.md:{line + call.lineno - 1}: "
                            f"{ast.unparse(call.func)}{signature}: {exc}")
            checked += 1
    assert checked >= 20  # the examples' calls to redrive were found and checked


# --- command lines -----------------------------------------------------------------------------


def command_lines() -> list[tuple[int, list[str], dict[str, str]]]:
    """Each `redrive ...` line of the unmarked blocks, as arguments, with the variables its block
    exported before it. Optional parts written `[--topic orders]` are taken as given."""
    found = []
    for line, source in blocks(""):
        env: dict[str, str] = {}
        for offset, text in enumerate(source.splitlines()):
            text = text.split("  #")[0].strip().removeprefix("$ ")
            if text.startswith("export "):
                name, _, value = text.removeprefix("export ").partition("=")
                env[name] = value
            elif text.startswith("redrive "):
                words = shlex.split(text.replace("[", "").replace("]", ""))
                found.append((line + offset, words[1:], dict(env)))
    return found


def test_the_readme_has_command_lines() -> None:
    assert len(command_lines()) >= 10


@pytest.mark.parametrize("line, args, env", [pytest.param(*found, id=f"line-{found[0]}")
                                             for found in command_lines()])
def test_each_command_line_parses(line: int, args: list[str], env: dict[str, str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    command: click.Command = cli
    context = cli.make_context("redrive", list(args))
    rest = [*context._protected_args, *context.args]
    try:
        while isinstance(command, click.Group):
            word, found, rest = command.resolve_command(context, rest)
            assert word is not None and found is not None
            command = found
            context = command.make_context(word, rest, parent=context)
            rest = [*context._protected_args, *context.args]
    except click.ClickException as exc:
        pytest.fail(f"README.md:{line}: redrive {' '.join(args)}: {exc.format_message()}")
    assert not rest, f"README.md:{line}: arguments left over: {rest}"
