"""Fuzzing of redrive.spark._fetchread's parser of fetch answers: the bytes a broker sends.

    PYTHONPATH=tests python -m fuzz.fetchread [--inputs N] [--seed S] [--first I]

Each input is a stream of Fetch v4 answers fed to a FetchReader in place of a connection
(`FetchReader.feed`), read to its end with random batch limits. Inputs are built three ways and
then, most of them, mutated (bits flipped, bytes and 32-bit fields overwritten with edge values,
cut, spliced, repeated):
- answers captured from noida-db (`seeds/`, written by `python -m fuzz.capture`): transactions
  committed and aborted with their markers, headers, null keys and values;
- record batches encoded by aiokafka's DefaultRecordBatchBuilder, an encoder written apart from
  redrive's reading of the protocol;
- batches from the unit tests' own encoder (`unit.spark.wire`) with random attributes, markers,
  aborted transactions, partition errors and offsets.
A finding is a crash or a sanitizer report (the process dies: run it under AddressSanitizer and
UndefinedBehaviorSanitizer: `fuzz.sanitized` builds it, and REDRIVE_SANITIZED makes this module
load that build), or a read that breaks the reader's contract:
Arrow buffers that do not validate, offsets not strictly rising inside [start, end), a position
past the end. The input being read is kept in a file (`--current`) so that a crash can be
replayed; findings of the contract are written to `--findings`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import random
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from pyspark.sql.pandas.types import to_arrow_schema

from fuzz import sanitized
from redrive.spark import buffers
from redrive.spark.options import kafka_schema
from unit.spark.wire import Answer, batch, fetch_answer, framed, record

TOPIC = "fuzzed"
SEEDS = Path(__file__).parent / "seeds"
SCHEMA = to_arrow_schema(kafka_schema(True), timezone="UTC")
# Values a mutation writes over a 32-bit field: lengths and counts at and past their edges.
EDGES = (0, 1, -1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 61, 12)
# Over a 64-bit field (base offset, timestamps, producer id): where offset and time arithmetic
# overflows.
EDGES64 = (0, -1, 2**63 - 1, -(2**63), 2**63 - 2, 2**62, 2**32, -(2**32), 0x7FFFFFFF)
# Over a varint (a record's lengths and deltas): the longest ones, at both ends of zigzag.
VARINTS = (b"\xfe" + b"\xff" * 8 + b"\x01", b"\xff" * 9 + b"\x01", b"\xff" * 10,
           b"\xfe\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x0f", b"\x80" * 9)


@dataclass(frozen=True)
class Case:
    answers: bytes
    start: int
    end: int
    headers: bool
    committed: bool
    max_rows: int
    max_bytes: int


# --- building inputs -----------------------------------------------------------------------------


def _maybe(rng: random.Random, value: bytes) -> bytes | None:
    return None if rng.random() < 0.15 else value


def _payload(rng: random.Random) -> bytes:
    size = rng.choice((0, 1, 3, 10, 100, rng.randrange(2000)))
    return rng.randbytes(size)


def _headers(rng: random.Random) -> list[tuple[str, bytes | None]]:
    names = ("redrive-attempt", "redrive-due", "h", "", "é", "x" * 40)
    count = rng.choice((0, 0, 1, 3))
    return [(rng.choice(names), _maybe(rng, _payload(rng))) for _ in range(count)]


def aiokafka_batch(rng: random.Random, base: int) -> tuple[bytes, int]:
    """A batch from aiokafka's encoder, and how many offsets it spans."""
    transactional = rng.random() < 0.3
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(transactional),
        producer_id=rng.randrange(1, 5) if transactional else -1,
        producer_epoch=0 if transactional else -1, base_sequence=-1, batch_size=1 << 24)
    count = rng.randrange(1, 30)
    for delta in range(count):
        headers = [(name, value if value is not None else b"") for name, value in _headers(rng)]
        builder.append(delta, timestamp=1_700_000_000_000 + rng.randrange(-5, 5_000),
                       key=_maybe(rng, _payload(rng)), value=_maybe(rng, _payload(rng)),
                       headers=headers)
    built = bytearray(builder.build())
    struct.pack_into(">q", built, 0, base)
    return bytes(built), count


def wire_batch(rng: random.Random, base: int) -> tuple[bytes, int]:
    """A batch from the unit tests' encoder with attributes aiokafka's cannot set: log-append
    time, transaction markers (commit or abort), compression flags, old formats."""
    roll = rng.random()
    if roll < 0.2:
        kind = rng.choice((0, 1))  # abort, commit
        marker = record(0, b"\0\0\0\0\0\0", struct.pack(">hh", 0, kind))
        return batch(base, [marker], attributes=0x30, producer_id=rng.randrange(1, 5)), 1
    count = rng.randrange(0, 12)
    records = [record(delta, _maybe(rng, _payload(rng)), _maybe(rng, _payload(rng)),
                      ts_delta=rng.randrange(-3, 100), headers=_headers(rng))
               for delta in range(count)]
    attributes = rng.choice((0, 0, 0x08, 0x10, 0x10, rng.randrange(1, 5), rng.randrange(64)))
    magic = 2 if rng.random() < 0.95 else rng.choice((0, 1, 3))
    return batch(base, records, attributes=attributes, producer_id=rng.randrange(-1, 5),
                 magic=magic, last_delta=None if rng.random() < 0.9 else rng.randrange(-2, 40),
                 base_ts=1_700_000_000_000), max(count, 1)


def generated(rng: random.Random) -> tuple[bytes, int, int]:
    """Answers of generated batches, and the range they span."""
    # The last one leaves room for the offsets a generated stream spans (at most about 600).
    first = rng.choice((0, 5, 1_000, 2**40, 2**63 - 10_000))
    at = first
    stream = []
    for correlation in range(1, rng.randrange(2, 5)):
        batches = []
        for _ in range(rng.randrange(0, 5)):
            built, span = (aiokafka_batch if rng.random() < 0.5 else wire_batch)(rng, at)
            batches.append(built)
            at += span + (rng.randrange(3) if rng.random() < 0.1 else 0)
        records = b"".join(batches)
        aborted = None if rng.random() < 0.6 else [
            (rng.randrange(1, 5), rng.randrange(first, at + 2)) for _ in range(rng.randrange(4))]
        error = 0 if rng.random() < 0.95 else rng.choice((1, 3, 6, 75))
        given = Answer(records=None if rng.random() < 0.02 else records, error=error,
                       high_watermark=at, aborted=aborted)
        stream.append(framed(correlation, fetch_answer(TOPIC, 0, given)))
    return b"".join(stream), first, at


def corpus(seed: int, size: int = 2_000) -> list[tuple[bytes, int, int]]:
    """The inputs mutations start from: the captured answers, and generated ones made once, since
    generating costs a hundred times what reading does."""
    rng = random.Random(seed)
    captured = [(path.read_bytes(), 0, 10_000) for path in sorted(SEEDS.glob("*.bin"))]
    return captured + [generated(rng) for _ in range(size)]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        if not out:
            out += rng.randbytes(rng.randrange(1, 16))
            continue
        at = rng.randrange(len(out))
        roll = rng.random()
        if roll < 0.3:
            out[at] ^= 1 << rng.randrange(8)
        elif roll < 0.5:
            out[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif roll < 0.62 and at + 4 <= len(out):
            struct.pack_into(">i", out, at, rng.choice(EDGES))
        elif roll < 0.7 and at + 8 <= len(out):
            struct.pack_into(">q", out, at, rng.choice(EDGES64))
        elif roll < 0.75:
            varint = rng.choice(VARINTS)
            out[at:at + len(varint)] = varint
        elif roll < 0.8:
            del out[at:]
        elif roll < 0.9:
            out[at:at] = rng.randbytes(rng.randrange(1, 32))
        else:
            piece = bytes(out[rng.randrange(len(out)):][:rng.randrange(1, 200)])
            out[at:at] = piece
    return bytes(out)


def case(seed: int, index: int, pool: list[tuple[bytes, int, int]]) -> Case:
    """Input `index` of run `seed` (whose corpus is `pool`): the same numbers, the same input."""
    rng = random.Random(seed * 1_000_003 + index)
    answers, first, end = generated(rng) if rng.random() < 0.02 else rng.choice(pool)
    if rng.random() < 0.9:
        answers = mutate(rng, answers)
    start = max(0, first + rng.choice((0, 0, 0, 1, 3, -1)))
    end = max(start, end + rng.choice((0, 0, 1, -1, -5, 100)))
    return Case(answers, start, end, rng.random() < 0.8, rng.random() < 0.7,
                rng.choice((1, 7, 1_000, 1_000, 1_000)), rng.choice((100, 1 << 20, 1 << 20)))


# --- reading an input and checking the contract ------------------------------------------------


def read(module: ModuleType, given: Case) -> Iterator[pa.RecordBatch]:
    reader = module.FetchReader("fed:0", TOPIC, 0, given.start, given.end, given.headers,
                                given.committed, 50)
    reader.feed(given.answers)
    schema = SCHEMA if given.headers else pa.schema(
        [f for f in SCHEMA if f.name != "headers"])
    with contextlib.suppress(module.ReadError):  # the one error it may raise: no progress
        yield from buffers.batches(reader, TOPIC, 0, schema, max_rows=given.max_rows,
                                   max_bytes=given.max_bytes)
    if reader.position > given.end:
        raise AssertionError(f"position {reader.position} past the end {given.end}")
    reader.close()


def check(module: ModuleType, given: Case) -> None:
    try:
        _check(module, given)
    except pa.ArrowInvalid as exc:
        raise AssertionError(f"Arrow buffers that do not validate: {exc}") from exc


def _check(module: ModuleType, given: Case) -> None:
    last = given.start - 1
    for found in read(module, given):
        found.validate(full=True)
        for offset in found.column("offset").to_pylist():
            if not last < offset < given.end:
                raise AssertionError(f"offset {offset} after {last}, range "
                                     f"[{given.start}, {given.end})")
            last = offset


# --- the run -------------------------------------------------------------------------------------


def run(module: ModuleType, seed: int, inputs: int, first: int, current: Path | None,
        findings: Path, say: Callable[[str], None]) -> int:
    pool = corpus(seed)
    marker: Any = None
    if current is not None:
        current.write_bytes(b"\0" * 8)
        handle = current.open("r+b")
        marker = mmap.mmap(handle.fileno(), 8)
    found = 0
    started = time.monotonic()
    for index in range(first, first + inputs):
        if marker is not None:
            struct.pack_into(">q", marker, 0, index)
        given = case(seed, index, pool)
        try:
            check(module, given)
        except AssertionError as exc:
            found += 1
            findings.mkdir(parents=True, exist_ok=True)
            (findings / f"{seed}-{index}.bin").write_bytes(given.answers)
            say(f"finding at input {index} (seed {seed}): {exc}")
        if (index - first + 1) % 100_000 == 0:
            say(f"{index - first + 1:,} inputs, {found} findings, "
                f"{(index - first + 1) / (time.monotonic() - started):,.0f}/s")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="the first input's index")
    parser.add_argument("--current", type=Path, help="file that holds the input being read")
    parser.add_argument("--findings", type=Path, default=Path("fuzz-findings"))
    args = parser.parse_args()
    sanitized.load_builds()
    from redrive.spark import _fetchread as module
    started = time.monotonic()
    found = run(module, args.seed, args.inputs, args.first, args.current, args.findings,
                lambda text: print(text, file=sys.stderr, flush=True))
    print(json.dumps({"inputs": args.inputs, "seed": args.seed, "findings": found,
                      "extension": module.__file__,
                      "seconds": round(time.monotonic() - started)}), flush=True)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
