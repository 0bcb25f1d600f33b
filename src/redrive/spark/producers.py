"""The producers a Python process keeps for Spark's tasks and batches, one per configuration.

Producers cannot be pickled, and a cache in a function shipped from __main__ is rebuilt for
every batch. This module is imported once per Python worker, which Spark reuses across tasks
and batches (and once per driver), so each process keeps one producer per configuration.

A worker outlives the queries that made its producers: kept for good, a producer would hold its
connections to the brokers after its pipeline stopped, and go on reconnecting (and logging each
refused try) to brokers that are gone. So one left unused for IDLE_CLOSE_S is closed, by a
thread of the process, and the next use makes a new one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from redrive import kafka
from redrive.kafka.produce import Shrink, discard_producer, producer_failed

# Longer than a batch's use of a producer, so one is never closed between its take and its
# sends; a pipeline triggered less often than this makes a new one per batch, which costs its
# idempotent id's wait (0.5-1 s) in a batch at most that often.
IDLE_CLOSE_S = 120.0
SWEEP_EVERY_S = 15.0


@dataclass
class _Kept:
    producer: Producer
    used_s: float
    sending: int = 0  # produce_cached calls under way: they may wait for acks a long time


_PRODUCERS: dict[str, _Kept] = {}
_LOCK = threading.Lock()
_sweeper: threading.Thread | None = None


def cached_producer(connection: kafka.Connection,
                    overrides: Mapping[str, Any] | None = None) -> Producer:
    """This process's producer for (connection, overrides), made at the first call and kept
    while it is used: a new one per task would connect again each time. Callers send through
    it at once, and wait for its acknowledgements for less than IDLE_CLOSE_S."""
    return _take(connection, overrides, sending=0).producer


def produce_cached(connection: kafka.Connection, records: Iterable[kafka.OutRecord],
                   timeout_s: float, overrides: Mapping[str, Any] | None = None, *,
                   shrink: Shrink | None = None) -> int:
    """`kafka.produce_acked` through this process's cached producer: how many were acked. One
    that failed for good is forgotten before the error is raised, so that the task's next
    attempt (Spark retries a failed task) or the batch run again makes a new one: kept, it
    would fail them all."""
    kept = _take(connection, overrides, sending=1)
    producer = kept.producer
    try:
        return kafka.produce_acked(producer, records, timeout_s, shrink=shrink)
    except Exception as exc:
        if producer_failed(exc):
            with _LOCK:
                for key in [k for k, each in _PRODUCERS.items() if each.producer is producer]:
                    del _PRODUCERS[key]
            discard_producer(producer)
        raise
    finally:
        with _LOCK:
            kept.sending -= 1
            kept.used_s = time.monotonic()


def _take(connection: kafka.Connection, overrides: Mapping[str, Any] | None,
          sending: int) -> _Kept:
    key = json.dumps([connection, dict(overrides or {})], sort_keys=True, default=str)
    with _LOCK:
        kept = _PRODUCERS.get(key)
        if kept is None:
            kept = _PRODUCERS[key] = _Kept(kafka.producer(connection, overrides=overrides), 0.0)
        kept.used_s = time.monotonic()
        kept.sending += sending
        _start_sweeper()
    return kept


def drop_cached_producers() -> None:
    """Forget this process's producers (without delivering what they hold): one failed for
    good, and the next cached_producer() call makes a new one."""
    with _LOCK:
        kept = list(_PRODUCERS.values())
        _PRODUCERS.clear()
    for each in kept:
        discard_producer(each.producer)


def close_idle(now_s: float | None = None) -> int:
    """Close the producers unused for IDLE_CLOSE_S; return how many."""
    now = time.monotonic() if now_s is None else now_s
    with _LOCK:
        idle = [key for key, kept in _PRODUCERS.items()
                if now - kept.used_s >= IDLE_CLOSE_S and not kept.sending]
        closed = [_PRODUCERS.pop(key).producer for key in idle]
    for producer in closed:
        discard_producer(producer)
    return len(closed)


def _start_sweeper() -> None:
    """Called holding _LOCK. A forked child inherits the thread's object, not the thread."""
    global _sweeper
    if _sweeper is None or not _sweeper.is_alive():
        _sweeper = threading.Thread(target=_sweep, name="redrive-idle-producers", daemon=True)
        _sweeper.start()


def _sweep() -> None:
    while True:
        time.sleep(SWEEP_EVERY_S)
        close_idle()
