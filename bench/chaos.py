"""Chaos suite: redrive's components in processes on noida-db, killed, stopped and fed garbage,
with every record counted.

    python bench/chaos.py [--quick] [--only NAME ...] [--json]

Each fault sends uniquely numbered records (the handler fails about 10 % of them once and 1 %
always), injects its fault, and counts from the broker and the sink what became of each:
succeeded, dead-lettered, lost, duplicated. `duplicated` counts what the fault's mode promises
once: at-least-once, the sink's successes and the dead letters; transactional, the dead letters
and the retry copies (the handler itself may run again after a crash in every mode: `re-handled`);
exactly-once (the Spark pipeline) and clean stops (SIGTERM), all of them. A number still waiting
inside redrive at the end (past the group's commit, in a store row) is `stuck`, not lost. A
transactional copy written and committed but passed over by the group's reader, a noida-db
deviation (chaoslib.count.passed_over), is `passed over`, not lost.

Exits non-zero on any loss, stuck or misrouted record, crashed part, or a duplicate where the
mode promises none. With --json the last line is one JSON object of the totals.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

from chaoslib.count import AT_LEAST_ONCE, TRANSACTIONAL, Outcome
from chaoslib.faults import Sizes
from chaoslib.suite import FAULTS, QUICK, Context
from redrive.cli.formatting import table


def run_fault(name: str, fault: Callable[[Context], Outcome], context: Context) -> Outcome:
    started = time.monotonic()
    try:
        outcome = fault(context)
    except Exception as exc:  # a fault that cannot finish counts as a crash, with its reason
        outcome = Outcome(name, "?", crashes=1,
                          notes=[f"the fault failed: {exc!r}", traceback.format_exc()[-1500:]])
    outcome.seconds = time.monotonic() - started
    return outcome


def totals(outcomes: list[Outcome]) -> dict[str, int]:
    def duplicated(transactional: bool) -> int:
        return sum(o.duplicated for o in outcomes if o.promises_no_duplicates == transactional)

    return {"faults": len(outcomes), "lost": sum(o.lost for o in outcomes),
            "duplicated_transactional": duplicated(True),
            "duplicated_at_least_once": duplicated(False),
            "crashes": sum(o.crashes for o in outcomes),
            "stuck_in_flight": sum(o.stuck for o in outcomes),
            "passed_over_by_broker": sum(o.passed_over for o in outcomes),
            "misrouted": sum(o.misrouted for o in outcomes)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the cheap faults, small sizes")
    parser.add_argument("--only", nargs="+", choices=sorted(FAULTS), default=None)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of totals")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the sinks and logs in this dir (default: a temporary dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    names = args.only or (QUICK if args.quick else list(FAULTS))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    began = time.monotonic()
    outcomes: list[Outcome] = []
    with TemporaryDirectory(prefix="redrive-chaos-") as temporary, \
            Context(args.keep or Path(temporary), Sizes(args.quick)) as context:
        for name in names:
            outcome = run_fault(name, FAULTS[name], context)
            outcomes.append(outcome)
            print(outcome.line() + ("" if not outcome.failed else "  <-- FAILED"), flush=True)
            for note in outcome.notes:
                print(f"    {note}", flush=True)
    print()
    print(table(["fault", "mode", "sent", "succeeded", "dead-lettered", "lost", "duplicated",
                 "re-handled", "stuck", "passed over", "misrouted", "crashes", "s"],
                [[o.fault, o.mode, o.sent, o.succeeded, o.dead_lettered, o.lost, o.duplicated,
                  o.rehandled, o.stuck, o.passed_over, o.misrouted, o.crashes,
                  f"{o.seconds:.0f}"]
                 for o in outcomes]))
    print(f"\n{started}, {time.monotonic() - began:.0f} s; modes: {AT_LEAST_ONCE} may "
          f"duplicate, {TRANSACTIONAL} and the others may not")
    failed = [o.fault for o in outcomes if o.failed]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    if args.json:
        print(json.dumps(totals(outcomes)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
