"""`make fuzz`: the C readers under AddressSanitizer and UndefinedBehaviorSanitizer.

    PYTHONPATH=tests python -m fuzz.run [--inputs N] [--workers W] [--seed S]

Builds the C extensions with the sanitizers, fuzzes the fetch reader's parser (`fuzz.fetchread`)
in W processes of N inputs each, then runs the C code's tests on the sanitized builds: the unit
tests of the plain-record loop, of the header contract's C (property tests against the Python
reference) and of the fetch reader, and the range readers' tests against
noida-db (which read through the librdkafka reader as well). A process that dies (a crash, or a
sanitizer's report: both end it) counts as a finding, and the input it was reading is saved in
`fuzz-findings/` to replay with `python -m fuzz.fetchread --seed S --first I --inputs 1`.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fuzz import sanitized

ROOT = sanitized.ROOT
FINDINGS = ROOT / "fuzz-findings"
# Tests that drive the C readers; the range readers' start noida-db through the suite's fixtures.
READER_TESTS = ("tests/unit/consumer/test_plain.py", "tests/unit/test_headers_c.py",
                "tests/unit/spark/test_fetch_reader.py",
                "tests/integration/spark/test_range_readers.py")


@dataclass(frozen=True)
class Outcome:
    inputs: int
    findings: int
    report: str  # what the processes that found something printed last
    extensions: frozenset[str]  # the builds the processes that ran to their end loaded


def fuzz(builds: Path, inputs: int, workers: int, seed: int, findings: Path = FINDINGS
         ) -> Outcome:
    """Fuzz the sanitized fetch reader in `workers` processes at once."""
    environment = sanitized.environment(builds)
    with tempfile.TemporaryDirectory() as scratch:
        running = []
        for worker in range(workers):
            current = Path(scratch) / f"current-{worker}"
            command = [sys.executable, "-m", "fuzz.fetchread", "--inputs", str(inputs),
                       "--seed", str(seed + worker), "--current", str(current),
                       "--findings", str(findings)]
            running.append((seed + worker, current, subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)))
        found, reports, loaded, ran = 0, [], set(), 0
        for worker_seed, current, process in running:
            out, err = process.communicate()
            summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
            if summary is not None:  # the process ran to its end; findings of the contract
                found += summary["findings"]
                ran += summary["inputs"]
                loaded.add(summary["extension"])
                if summary["findings"]:
                    reports.append(err[-2000:])
                if process.returncode != 0:
                    # A report or a crash after the last input (at the interpreter's exit).
                    found += 1
                    reports.append(f"seed {worker_seed} ended with exit {process.returncode} "
                                   f"after its summary:\n{err[-4000:]}")
                continue
            found += 1
            index = struct.unpack(">q", current.read_bytes()[:8])[0] if current.exists() else -1
            ran += max(0, index + 1)  # inputs are numbered from 0; index is the one it died on
            reports.append(f"seed {worker_seed}, input {index} ended the process "
                           f"(exit {process.returncode}); replay it with --seed {worker_seed} "
                           f"--first {index} --inputs 1:\n{err[-4000:]}")
    return Outcome(ran, found, "\n".join(reports), frozenset(loaded))


def reader_tests(builds: Path, tests: tuple[str, ...] = READER_TESTS
                 ) -> subprocess.CompletedProcess[str]:
    """The C readers' tests on the sanitized builds."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "fuzz.sanitized", "-p", "no:cacheprovider",
         *tests], cwd=ROOT, env=sanitized.environment(builds), capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs per worker")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as builds:
        built = sanitized.build(Path(builds))
        print("sanitized builds: " + ", ".join(sorted(built)), flush=True)
        outcome = fuzz(Path(builds), args.inputs, args.workers, args.seed)
        print(f"fetch reader: {outcome.inputs:,} inputs, {outcome.findings} findings", flush=True)
        if outcome.report:
            print(outcome.report)
        tests = reader_tests(Path(builds))
        print(f"C readers' tests on the sanitized builds: {tests.stdout.strip().splitlines()[-1]}")
        if tests.returncode != 0:
            print(tests.stdout[-4000:] + tests.stderr[-4000:])
    sys.exit(1 if outcome.findings or tests.returncode != 0 else 0)


if __name__ == "__main__":
    main()
