"""Fixtures shared by every test: the session's brokers, unique topics and names.

The session broker is noida-db, started once in a temporary dir on a free port. Setting
REDRIVE_TEST_BOOTSTRAP=host:port runs the same suite against that cluster instead (nothing is
started, and tests that need Tansu are skipped). Tests that use a broker are marked
`integration` (and `tansu` for Tansu) automatically.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import settings
from xdist.scheduler import LoadFileScheduling

from redrive import kafka
from redrive.dev.brokers import DevBroker

# Property tests check outcomes, not speed: on a 2-core machine an example's time is the load of
# whatever else runs (a JVM, a broker), so hypothesis's 200 ms deadline would fail them at random.
settings.register_profile("redrive", deadline=None)
settings.load_profile("redrive")

# grpcio 1.81 and later (grpc/grpc#43055): while a Spark Connect client's channel is open, a child
# forked with a preexec_fn, as pyspark forks the classic session's JVM, now and then aborts
# before exec (SIGABRT, "epoll_wait error: Bad file descriptor"), and the session fails to start
# with JAVA_GATEWAY_EXITED. gRPC's fork handlers are for children that go on using gRPC, which
# none here does; grpc reads this when first imported, which no test module has done yet.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

EXTERNAL_ENV = "REDRIVE_TEST_BOOTSTRAP"
BROKER_FIXTURES = frozenset({"broker", "bootstrap", "new_topic"})
TANSU_FIXTURES = frozenset({"tansu", "tansu_topic"})
TOPIC_READY_TIMEOUT_S = 30.0
# Room for the suffixes redrive appends (".<group>.retry.<delay>", ".dlt") within Kafka's 249.
NAME_PREFIX_MAX = 80

NewTopic = Callable[..., str]
UniqueName = Callable[..., str]


class SessionBroker(Protocol):
    """What tests may rely on, whichever broker serves the session."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class ExternalBroker:
    bootstrap: str
    kind: str = "external"


def external_bootstrap() -> str | None:
    return os.environ.get(EXTERNAL_ENV) or None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & (BROKER_FIXTURES | TANSU_FIXTURES):
            item.add_marker(pytest.mark.integration)
        if fixtures & TANSU_FIXTURES:
            item.add_marker(pytest.mark.tansu)


SPARK_TESTS = "tests/integration/spark/"
# Files whose drivers are processes of their own (cluster_runner.py, driver_runner.py), sharing
# no JVM with the other Spark files: each alone is a unit any worker can take.
SPARK_OWN_DRIVER_TESTS = (SPARK_TESTS + "test_cluster.py", SPARK_TESTS + "test_driver_crash.py")
# The Spark Connect server's files, and enough classic ones to make the two halves about equal
# (453 s and 452 s of a 2026-11-29 run): each half is a unit with a JVM of its own, so two
# workers run Spark at once instead of one worker running 905 s of it.
SPARK_CONNECT_UNIT = tuple(SPARK_TESTS + name for name in (
    "test_connect_pipeline.py", "test_connect_source.py", "test_dead_letter_table.py",
    "test_scheduled_runs.py", "test_spark_source.py", "test_pipeline_outage.py"))


class SparkFilesTogether(LoadFileScheduling):
    """`--dist loadfile` (what `make test` runs on three workers), with the files under
    tests/integration/spark/ in two units, so that a worker's JVM and the Connect server start
    once. Being the largest units, they start first, and the third worker takes the other
    files one by one meanwhile, the standalone cluster's and the driver crash test's among
    them."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(SPARK_TESTS) and not nodeid.startswith(SPARK_OWN_DRIVER_TESTS):
            return SPARK_TESTS + ("connect" if nodeid.startswith(SPARK_CONNECT_UNIT)
                                  else "classic")
        return super()._split_scope(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return SparkFilesTogether(config, log) if config.getvalue("dist") == "loadfile" else None


def sanitize(text: str) -> str:
    """Text reduced to characters legal in topic names and group ids, '.' excluded.

    Kafka treats '.' and '_' as colliding in topic names, and redrive uses '.' as its separator.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")
    return cleaned[:NAME_PREFIX_MAX] or "t"


def make_unique_name(prefix: str) -> str:
    return f"{sanitize(prefix)}-{uuid.uuid4().hex[:8]}"


def start_dev_broker(kind: str, data_dir: Path) -> DevBroker:
    return DevBroker(kind, data_dir=data_dir).start(timeout_s=60.0)


def wait_for_topic(bootstrap: str, topic: str, partitions: int,
                   timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
    """Return once metadata shows the topic with exactly `partitions` partitions."""
    admin = kafka.admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    seen: int | None = None
    while time.monotonic() < deadline:
        seen = kafka.topic_partitions(admin).get(topic)
        if seen == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {topic!r} on {bootstrap}: expected {partitions} partition(s) "
                         f"in metadata, saw {seen} after {timeout_s}s")


def topic_factory(bootstrap: str, request: pytest.FixtureRequest) -> NewTopic:
    def new_topic(partitions: int = 1, name: str | None = None,
                  config: dict[str, str] | None = None) -> str:
        if partitions < 1:
            raise ValueError(f"invalid partitions={partitions!r}: must be >= 1")
        topic = name if name is not None else make_unique_name(request.node.name)
        admin = kafka.admin(bootstrap)
        if topic not in kafka.create_topics(admin, {topic: partitions}, config=config):
            existing = kafka.partition_count(admin, topic)
            if existing != partitions:
                raise ValueError(f"invalid partitions={partitions!r}: topic {topic!r} already "
                                 f"exists with {existing} partition(s)")
        wait_for_topic(bootstrap, topic, partitions)
        return topic

    return new_topic


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionBroker]:
    """The session's Kafka broker: noida-db, or the cluster named by REDRIVE_TEST_BOOTSTRAP."""
    external = external_bootstrap()
    if external is not None:
        kafka.check_reachable(external, timeout_s=30.0)
        yield ExternalBroker(external)
        return
    dev = start_dev_broker("noida-db", tmp_path_factory.mktemp("noida-db"))
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture(scope="session")
def bootstrap(broker: SessionBroker) -> str:
    return broker.bootstrap


@pytest.fixture
def new_topic(bootstrap: str, request: pytest.FixtureRequest) -> NewTopic:
    """new_topic(partitions=1, name=None, config=None) -> str: create a topic (with these topic
    configs) and wait until it is usable.

    Without a name, the topic is named after the test plus a random suffix. A given name is used
    as it is; an existing topic of that name must already have `partitions` partitions.
    """
    return topic_factory(bootstrap, request)


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionBroker]:
    """A Tansu broker for the session, started only if a test asks for it."""
    if external_bootstrap() is not None:
        pytest.skip(f"{EXTERNAL_ENV} is set: the suite runs against that cluster only, "
                    "so tests that need the Tansu dev broker are skipped")
    dev = start_dev_broker("tansu", tmp_path_factory.mktemp("tansu"))
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture
def tansu_topic(tansu: SessionBroker, request: pytest.FixtureRequest) -> NewTopic:
    """Like new_topic, on the Tansu broker."""
    return topic_factory(tansu.bootstrap, request)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> UniqueName:
    """unique_name(prefix=None) -> str: a fresh name (group id, transactional id...) per call.

    The prefix defaults to the test's name; a random suffix keeps reruns on a cluster apart.
    """
    def make(prefix: str | None = None) -> str:
        return make_unique_name(prefix if prefix is not None else request.node.name)

    return make
