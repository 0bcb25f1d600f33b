"""The faults by name, and what they share: one noida-db for the faults that do not stop the
broker, and a PostgreSQL server started only if a fault needs one."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from chaoslib import faults, malformed, services, spark_fault
from chaoslib.count import AT_LEAST_ONCE, TRANSACTIONAL, Outcome
from chaoslib.faults import Sizes
from redrive.dev.brokers import DevBroker
from redrive.dev.postgres import DevPostgres


class Context:
    def __init__(self, scratch: Path, sizes: Sizes, bootstrap: str | None = None) -> None:
        self.scratch = scratch
        self.sizes = sizes
        self._bootstrap = bootstrap
        self._broker: DevBroker | None = None
        self._postgres: DevPostgres | None = None

    @property
    def bootstrap(self) -> str:
        """The broker every fault shares that does not stop it (given, or started once)."""
        if self._bootstrap is not None:
            return self._bootstrap
        if self._broker is None:
            self._broker = DevBroker("noida-db", data_dir=self.scratch / "broker").start(60)
        return self._broker.bootstrap

    def postgres_url(self) -> str:
        if self._postgres is None:
            self._postgres = DevPostgres(durable=False).start()
        return self._postgres.create_database()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._broker is not None:
            self._broker.close()
        if self._postgres is not None:
            self._postgres.stop()


Fault = Callable[[Context], Outcome]

FAULTS: dict[str, Fault] = {
    "consumer-kill-alo": lambda c: faults.consumer_kill(c.bootstrap, c.scratch, c.sizes,
                                                        AT_LEAST_ONCE),
    "consumer-kill-tx": lambda c: faults.consumer_kill(c.bootstrap, c.scratch, c.sizes,
                                                       TRANSACTIONAL),
    "broker-kill-alo": lambda c: faults.broker_kill(c.scratch, c.sizes, AT_LEAST_ONCE),
    "broker-kill-tx": lambda c: faults.broker_kill(c.scratch, c.sizes, TRANSACTIONAL),
    "broker-stop-alo": lambda c: faults.broker_stop(c.scratch, c.sizes, AT_LEAST_ONCE),
    "broker-stop-tx": lambda c: faults.broker_stop(c.scratch, c.sizes, TRANSACTIONAL),
    "delay-kill": lambda c: services.delay_service(c.bootstrap, c.scratch, c.sizes,
                                                   signal.SIGKILL),
    "store-kill-sqlite": lambda c: services.store_scheduler(
        c.bootstrap, c.scratch, c.sizes, str(c.scratch / "store-kill.db"), "SQLite",
        signal.SIGKILL),
    "store-kill-postgresql": lambda c: services.store_scheduler(
        c.bootstrap, c.scratch, c.sizes, c.postgres_url(), "PostgreSQL", signal.SIGKILL),
    "malformed-headers": lambda c: malformed.malformed_headers(c.bootstrap, c.scratch, c.sizes),
    "spark-driver-kill": lambda c: spark_fault.spark_driver(c.bootstrap, c.scratch, c.sizes),
    "consumer-term": lambda c: faults.consumer_term(c.bootstrap, c.scratch, c.sizes),
    "delay-term": lambda c: services.delay_service(c.bootstrap, c.scratch, c.sizes,
                                                   signal.SIGTERM),
    "store-term": lambda c: services.store_scheduler(
        c.bootstrap, c.scratch, c.sizes, str(c.scratch / "store-term.db"), "SQLite",
        signal.SIGTERM),
}
# What `make test` runs (tests/integration/test_chaos_quick.py), at --quick sizes.
QUICK = ["consumer-kill-tx", "consumer-term", "malformed-headers"]
