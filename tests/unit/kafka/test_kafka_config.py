"""Client configs: an override may not turn off what redrive's guarantees rest on (acks all and
idempotence for its producers, no automatic commit or offset store for its consumers), while any
override that keeps them, and every other setting, goes through."""

from __future__ import annotations

from typing import Any

import pytest

from redrive import kafka
from redrive.errors import InvalidArgument


@pytest.mark.parametrize(("name", "value"), [
    ("acks", 0), ("acks", "1"), ("request.required.acks", 1), ("enable.idempotence", False),
    ("enable.idempotence", "false"), ("enable.idempotence", "f"), ("enable.idempotence", 0),
])
def test_a_producer_override_that_gives_up_confirmed_or_idempotent_delivery_is_refused(
        name: str, value: Any) -> None:
    # Before, producer_config(..., overrides={'enable.idempotence': False, 'acks': 0}) returned
    # acks 0: delivery reports without the broker confirming anything.
    overrides = {name: value, **({"enable.idempotence": False} if "acks" in name else {})}
    with pytest.raises(InvalidArgument) as caught:
        kafka.producer_config("127.0.0.1:9", overrides=overrides)
    assert caught.value.field == name and caught.value.value == value
    assert f"invalid {name}={value!r}: redrive needs" in str(caught.value)
    with pytest.raises(InvalidArgument):
        kafka.producer("127.0.0.1:9", transactional_id="t", overrides=overrides)


@pytest.mark.parametrize(("name", "value"), [
    ("enable.auto.commit", True), ("enable.auto.commit", "true"),
    ("enable.auto.offset.store", True), ("enable.auto.offset.store", "1"),
])
def test_a_consumer_override_that_commits_or_stores_offsets_by_itself_is_refused(
        name: str, value: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        kafka.consumer_config("127.0.0.1:9", "g", {name: value})
    assert caught.value.field == name and caught.value.value == value
    assert f"redrive needs {name}=false" in str(caught.value)


@pytest.mark.parametrize("overrides", [
    {"acks": "all"}, {"acks": -1}, {"acks": "-1"}, {"request.required.acks": "all"},
    {"enable.idempotence": True}, {"enable.idempotence": "true"}, {"linger.ms": 50},
])
def test_producer_overrides_that_keep_the_guarantees_go_through(
        overrides: dict[str, Any]) -> None:
    config = kafka.producer_config("127.0.0.1:9", overrides=overrides)
    assert config.items() >= overrides.items()
    assert config["enable.idempotence"] in (True, "true")


@pytest.mark.parametrize("overrides", [
    {"enable.auto.commit": False}, {"enable.auto.offset.store": "false"},
    {"isolation.level": "read_uncommitted"},
])
def test_consumer_overrides_that_keep_the_guarantees_go_through(
        overrides: dict[str, Any]) -> None:
    config = kafka.consumer_config("127.0.0.1:9", None, overrides)
    assert config.items() >= overrides.items()


def test_a_user_config_with_those_settings_gets_redrive_s_values() -> None:
    user = {"bootstrap.servers": "127.0.0.1:9", "acks": 0, "enable.auto.commit": True}
    assert kafka.producer_config(user)["acks"] == "all"
    assert kafka.consumer_config(user)["enable.auto.commit"] is False
