"""The quick subset of the chaos suite (bench/chaos.py; `make chaos` runs all of it), through
the same code at small sizes: consumer processes SIGKILLed in transactional mode and SIGTERMed,
and records with random redrive headers. Nothing may be lost, stuck or misrouted, no part may
crash, and nothing may be duplicated where the mode promises it once."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _suite() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("chaoslib.suite")
    finally:
        sys.path.remove(str(BENCH))


suite = _suite()


@pytest.mark.parametrize("name", suite.QUICK)
def test_a_quick_fault_loses_and_duplicates_nothing_it_promises(
        name: str, bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with suite.Context(tmp_path, suite.Sizes(quick=True), bootstrap=bootstrap) as context:
        outcome = suite.FAULTS[name](context)
    with capsys.disabled():
        print(f"\n  {outcome.line()} in {outcome.seconds:.0f} s")
    assert outcome.sent > 0
    assert (outcome.lost, outcome.stuck, outcome.misrouted, outcome.crashes) == (0, 0, 0, 0), \
        outcome.notes
    assert outcome.succeeded + outcome.dead_lettered <= outcome.sent
    if outcome.promises_no_duplicates:
        assert outcome.duplicated == 0, outcome.notes
    assert not outcome.failed
    if outcome.passed_over:
        pytest.xfail("; ".join(outcome.notes))
