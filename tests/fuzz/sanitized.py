"""redrive's C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer, and a way to
run Python code on them.

    PYTHONPATH=tests python -m fuzz.sanitized DIR            # builds them into DIR
    PYTHONPATH=tests python -m pytest -p fuzz.sanitized ...  # tests on them: REDRIVE_SANITIZED=DIR

A sanitized extension needs the sanitizer runtimes loaded before Python starts (LD_PRELOAD), so
`environment()` gives what a subprocess needs. As a pytest plugin this module puts the builds of
REDRIVE_SANITIZED in place of the installed extensions before the tests' conftest imports them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (module, sources, libraries): as pyproject.toml builds them.
EXTENSIONS = (
    ("redrive.spark._fetchread",
     ("src/redrive/spark/_fetchread.c", "src/redrive/spark/_fetchconn.c"), ()),
    ("redrive.spark._rangeread", ("src/redrive/spark/_rangeread.c",), ("rdkafka",)),
    ("redrive.consumer._plainrun", ("src/redrive/consumer/_plainrun.c",), ()),
    ("redrive._headers", ("src/redrive/_headers.c",), ()),
)
FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined", "-shared", "-fPIC")
# Python's own allocations are not the extensions' leaks; any error ends the process at once.
OPTIONS = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


def build(into: Path) -> dict[str, Path]:
    """Build every extension whose libraries are present; return module name -> shared object."""
    into.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    built = {}
    for module, sources, libraries in EXTENSIONS:
        target = into / (module.rsplit(".", 1)[1] + ".so")
        command = ["gcc", *FLAGS, f"-I{include}", *(str(ROOT / s) for s in sources), "-o",
                   str(target), *(f"-l{name}" for name in libraries)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            if libraries:  # optional, as in pyproject.toml: librdkafka's headers may be missing
                continue
            raise RuntimeError(f"building {module} failed:\n{done.stderr}")
        built[module] = target
    return built


def runtime(name: str) -> str:
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()


def environment(builds: Path) -> Mapping[str, str]:
    """The environment of a Python process that loads the builds in `builds`."""
    return {**os.environ, **OPTIONS, "REDRIVE_SANITIZED": str(builds),
            "LD_PRELOAD": f"{runtime('libasan.so')} {runtime('libubsan.so')}",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


def load(module: str, path: Path) -> None:
    """Import the build at `path` as `module`, ahead of the installed one; its package is
    imported later (see load_builds)."""
    loader = importlib.machinery.ExtensionFileLoader(module, str(path))
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    assert spec is not None
    loaded = importlib.util.module_from_spec(spec)
    loader.exec_module(loaded)
    sys.modules[module] = loaded


def load_builds() -> bool:
    """Load the builds REDRIVE_SANITIZED names, if it names any. Every build is in sys.modules
    before any package is imported: a package imported for one would bind the installed
    extension of another (redrive.spark imports redrive.headers, which takes _headers)."""
    builds = os.environ.get("REDRIVE_SANITIZED")
    if not builds:
        return False
    loaded = []
    for module, _, _ in EXTENSIONS:
        path = Path(builds) / (module.rsplit(".", 1)[1] + ".so")
        if path.exists():
            load(module, path)
            loaded.append(module)
    for module in loaded:
        parent, _, name = module.rpartition(".")
        setattr(importlib.import_module(parent), name, sys.modules[module])
    return True


def bound() -> dict[str, str]:
    """The file of each C extension as the modules that call it bound it."""
    from redrive import headers
    from redrive.consumer import plain
    from redrive.spark import _fetchread

    return {"redrive.headers": str(getattr(headers._headers, "__file__", None)),
            # A C function's __self__ is the module that defines it.
            "redrive.consumer.plain": str(getattr(getattr(plain.handle_plain, "__self__", None),
                                                  "__file__", None)),
            "redrive.spark._fetchread": str(_fetchread.__file__)}


def pytest_load_initial_conftests() -> None:
    """Before any conftest imports redrive, so that no module binds an installed extension."""
    if not load_builds():
        raise RuntimeError("-p fuzz.sanitized needs REDRIVE_SANITIZED (see environment())")


if __name__ == "__main__":
    for name, path in build(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
