"""The warning a pipeline logs at start when the session runs speculative tasks."""

from __future__ import annotations

import logging

import pytest

from redrive.spark.stream import warn_if_speculative


class Conf:
    """What warn_if_speculative reads of a session: spark.conf.get(key, default)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str) -> str:
        return self.values.get(key, default)


class Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = Conf(values)


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_a_speculative_session_is_warned_of_naming_the_pipeline_and_the_setting(
        value: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="redrive.spark"):
        assert warn_if_speculative(Session({"spark.speculation": value}), "billing")
    [record] = caplog.records
    assert "pipeline billing: spark.speculation is on" in record.getMessage()
    assert "retried twice" in record.getMessage()


@pytest.mark.parametrize("values", [{}, {"spark.speculation": "false"}])
def test_other_sessions_are_not(values: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="redrive.spark"):
        assert not warn_if_speculative(Session(values), "billing")
    assert caplog.records == []
