"""The C readers under AddressSanitizer and UndefinedBehaviorSanitizer, briefly: `make fuzz` runs
the same with millions of inputs and the range readers' tests on a broker as well."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz import run, sanitized


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("sanitized")
    built = sanitized.build(into)
    assert {"redrive.spark._fetchread", "redrive.consumer._plainrun",
            "redrive._headers"} <= set(built)
    return into


def test_a_short_fuzz_run_of_the_fetch_reader_finds_nothing(builds: Path,
                                                            tmp_path: Path) -> None:
    outcome = run.fuzz(builds, inputs=10_000, workers=2, seed=1_000, findings=tmp_path)
    assert (outcome.inputs, outcome.findings) == (20_000, 0), outcome.report
    assert outcome.extensions == {str(builds / "_fetchread.so")}
    assert not list(tmp_path.iterdir())


def test_the_modules_that_call_the_c_code_bind_the_sanitized_builds(builds: Path) -> None:
    """The plugin loads every build before importing a package: loaded one by one, importing
    redrive.spark for the first bound redrive.headers to the installed _headers."""
    script = ("import json, sys; from fuzz import sanitized; sanitized.load_builds(); "
              "print(json.dumps(sanitized.bound()))")
    done = subprocess.run([sys.executable, "-c", script], cwd=sanitized.ROOT,
                          env=sanitized.environment(builds), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert files == {"redrive.headers": str(builds / "_headers.so"),
                     "redrive.consumer.plain": str(builds / "_plainrun.so"),
                     "redrive.spark._fetchread": str(builds / "_fetchread.so")}


def test_the_c_readers_unit_tests_pass_on_the_sanitized_builds(builds: Path) -> None:
    done = run.reader_tests(builds, run.READER_TESTS[:3])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
