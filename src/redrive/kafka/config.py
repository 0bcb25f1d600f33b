"""Client configs and clients: the one place in redrive that builds a librdkafka config.

Callers pass either a bootstrap address or a mapping of librdkafka settings (the user's own, such
as security settings), plus overrides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from redrive.errors import BrokerUnavailable, InvalidArgument

ClientConfig = dict[str, Any]
Connection = str | Mapping[str, Any]

MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes

PRODUCER_DEFAULTS: Mapping[str, Any] = {
    # Retry and dead-letter copies must not be duplicated or reordered by producer retries.
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
}
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    # redrive commits only what it finished or routed, never on a timer.
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}


# Settings the guarantees rest on, and why an override may not turn them off. acks all: a
# delivery report says the broker has the copy, so the offsets behind it may be committed.
# Idempotence: producer retries neither duplicate nor reorder copies. No automatic commit or
# offset store: an offset is committed only for what was finished or routed.
_ACKS = ("acks", "request.required.acks")
_REQUIRED_PRODUCER = {
    "enable.idempotence": (True, "producer retries could then duplicate or reorder the retry "
                                 "and dead-letter copies"),
}
_REQUIRED_CONSUMER = {
    "enable.auto.commit": (False, "redrive commits only the offsets of records it finished or "
                                  "routed, never on a timer"),
    "enable.auto.offset.store": (False, "redrive stores only the offsets of records it finished "
                                        "or routed"),
}


def client_config(connection: Connection,
                  overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    """A librdkafka config from a bootstrap address or a user config, with overrides on top."""
    if isinstance(connection, str):
        config: ClientConfig = {"bootstrap.servers": connection}
    elif isinstance(connection, Mapping):
        config = dict(connection)
    else:
        raise InvalidArgument("connection", connection, "must be a bootstrap address "
                              "('host:9092') or a mapping of client settings")
    if not config.get("bootstrap.servers"):
        raise BrokerUnavailable(str(config.get("bootstrap.servers", "")),
                                "bootstrap.servers is not set")
    config.update(overrides or {})
    return config


def producer_config(connection: Connection, *, transactional_id: str | None = None,
                    overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    """Raises InvalidArgument for an override of acks other than all, or of idempotence off."""
    for name in _ACKS:
        value = (overrides or {}).get(name, "all")
        if str(value).lower() not in ("all", "-1"):
            raise InvalidArgument(name, value, "redrive needs acks=all: a delivery report must "
                                  "mean the brokers have the copy before the offsets behind it "
                                  "are committed")
    _check_required(overrides, _REQUIRED_PRODUCER)
    config = client_config(connection, {**PRODUCER_DEFAULTS, **(overrides or {})})
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


def consumer_config(connection: Connection, group_id: str | None = None,
                    overrides: Mapping[str, Any] | None = None) -> ClientConfig:
    """Raises InvalidArgument for an override that turns on automatic commits or offset
    stores."""
    _check_required(overrides, _REQUIRED_CONSUMER)
    config = client_config(connection, {**CONSUMER_DEFAULTS, **(overrides or {})})
    if group_id is not None:
        config["group.id"] = group_id
    elif "group.id" not in config:
        # librdkafka needs a group id even for assign-only consumers that never commit.
        config["group.id"] = "redrive-unused"
    return config


def _check_required(overrides: Mapping[str, Any] | None,
                    required: Mapping[str, tuple[bool, str]]) -> None:
    for name, (needed, why) in required.items():
        if overrides is not None and name in overrides \
                and _flag(overrides[name]) is not needed:
            raise InvalidArgument(name, overrides[name], f"redrive needs {name}="
                                  f"{str(needed).lower()}: {why}")


def _flag(value: Any) -> bool | None:
    """A boolean setting's value as librdkafka reads it; None for what it would refuse."""
    text = str(value).lower()
    if text in ("true", "t", "1"):
        return True
    if text in ("false", "f", "0"):
        return False
    return None


def producer(connection: Connection, *, transactional_id: str | None = None,
             overrides: Mapping[str, Any] | None = None) -> Producer:
    config = producer_config(connection, transactional_id=transactional_id, overrides=overrides)
    try:
        return Producer(config)
    except KafkaException as exc:
        raise refused_setting(exc, config) from exc


def consumer(connection: Connection, group_id: str | None = None,
             overrides: Mapping[str, Any] | None = None) -> Consumer:
    config = consumer_config(connection, group_id, overrides)
    try:
        return Consumer(config)
    except KafkaException as exc:
        raise refused_setting(exc, config) from exc


def refused_setting(exc: KafkaException, config: ClientConfig) -> Exception:
    """librdkafka's refusal of a setting (a name it does not know, a value it cannot read) as
    InvalidArgument naming the setting and its value (hidden for a secret); any other error as
    it is."""
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError) or error.code() != KafkaError._INVALID_ARG:
        return exc
    why = error.str()
    named = _PROPERTY.search(why)
    name = named.group(1) if named else "client setting"
    value = config.get(name, config.get(_ALIASES.get(name, ""), "?"))
    if _SECRET.search(name):
        # librdkafka's own text may repeat the value.
        value = "(hidden)"
        why = ("librdkafka has no setting of this name" if "No such" in why
               else "librdkafka cannot read its value")
    return InvalidArgument(name, value, why)


_PROPERTY = re.compile(r'property:? "?([\w.-]+)"?')
# librdkafka names some settings by their other name when it refuses them.
_ALIASES = {"request.required.acks": "acks"}
# Values not shown: a secret's, or a mistyped one's (sasl.passwrd).
_SECRET = re.compile(r"^(sasl|ssl)\.|pass|secret|token|key|jaas|cred|auth", re.I)


class Admin(AdminClient):
    """An AdminClient that remembers its bootstrap address, so errors can name it."""

    def __init__(self, config: ClientConfig) -> None:
        try:
            super().__init__(config)
        except KafkaException as exc:
            raise refused_setting(exc, config) from exc
        self.bootstrap = str(config["bootstrap.servers"])
        # The largest record redrive's clients of this connection will produce.
        self.record_limit = int(config.get("message.max.bytes", MESSAGE_MAX_BYTES))


def admin(connection: Connection, overrides: Mapping[str, Any] | None = None) -> Admin:
    return Admin(client_config(connection, overrides))


def admin_beside(connection: Connection, producer_overrides: Mapping[str, Any]) -> Admin:
    """An Admin whose `record_limit` is that of a producer made with these overrides."""
    return admin(connection, {name: value for name, value in producer_overrides.items()
                              if name == "message.max.bytes"})
