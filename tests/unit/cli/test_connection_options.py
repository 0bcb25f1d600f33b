"""The connection every command's clients share: --bootstrap, --config-file and -X, which wins
where they overlap, and the errors for a missing broker list or a line that is not KEY=VALUE."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from redrive.cli.options import connection_options
from redrive.errors import InvalidArgument
from redrive.kafka import admin, consumer, producer


@click.command()
@connection_options
def shown(connection: dict[str, str]) -> None:
    click.echo(json.dumps(connection, sort_keys=True))


def run(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(shown, list(args), env={"REDRIVE_BOOTSTRAP": "", **(env or {})})


def test_the_file_then_each_setting_then_bootstrap_win_in_turn(tmp_path: Path) -> None:
    settings = tmp_path / "client.properties"
    settings.write_text("# a secured cluster\n! also a comment\n\n"
                        "bootstrap.servers = from-file:9092\nsecurity.protocol=SASL_SSL\n"
                        "sasl.password=with=equals\n")
    result = run("--config-file", str(settings), "-X", "security.protocol=SSL")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"bootstrap.servers": "from-file:9092",
                                         "sasl.password": "with=equals",
                                         "security.protocol": "SSL"}
    result = run("-b", "flag:9092", env={"REDRIVE_KAFKA_CONFIG": str(settings)})
    assert json.loads(result.output)["bootstrap.servers"] == "flag:9092"
    assert json.loads(result.output)["security.protocol"] == "SASL_SSL"


def test_an_exported_bootstrap_does_not_override_the_settings_brokers(tmp_path: Path) -> None:
    """Left exported, a development cluster's address sent a command holding another cluster's
    credentials there."""
    settings = tmp_path / "prod.properties"
    settings.write_text("bootstrap.servers=prod:9092\nsasl.password=p\n")
    exported = {"REDRIVE_BOOTSTRAP": "dev:9092"}
    for args in (["--config-file", str(settings)], ["-X", "bootstrap.servers=prod:9092"]):
        result = run(*args, env=exported)
        assert json.loads(result.output)["bootstrap.servers"] == "prod:9092", args
    assert json.loads(run(env=exported).output) == {"bootstrap.servers": "dev:9092"}
    result = run("-b", "flag:9092", "--config-file", str(settings), env=exported)
    assert json.loads(result.output)["bootstrap.servers"] == "flag:9092"


def test_a_setting_without_its_equals_sign_is_not_echoed() -> None:
    result = run("-b", "b:9092", "-X", "sasl.password hunter2")
    assert result.exit_code == 2
    assert "expected KEY=VALUE" in result.output and "hunter2" not in result.output


def test_no_broker_list_anywhere_is_a_usage_error() -> None:
    result = run("-X", "client.id=x")
    assert result.exit_code == 2
    assert "which brokers? give --bootstrap (or REDRIVE_BOOTSTRAP), or bootstrap.servers" in (
        result.output)


def test_a_line_that_is_not_a_setting_is_named_by_number_not_shown(tmp_path: Path) -> None:
    settings = tmp_path / "client.properties"
    settings.write_text("bootstrap.servers=b:9092\nsasl.password hunter2\n")
    result = run("--config-file", str(settings))
    assert result.exit_code == 2
    assert f"{settings} line 2 is not KEY=VALUE" in result.output
    assert "hunter2" not in result.output
    result = run("--config-file", str(tmp_path / "missing.properties"))
    assert result.exit_code == 2 and "missing.properties cannot be read" in result.output


@pytest.mark.parametrize("make", [admin, consumer, producer])
def test_a_setting_librdkafka_refuses_is_named_with_its_value_a_secrets_hidden(
        make: object) -> None:
    with pytest.raises(InvalidArgument, match=r"invalid no\.such\.setting='1': No such config"):
        make({"bootstrap.servers": "127.0.0.1:1", "no.such.setting": "1"})  # type: ignore
    for name, secret in (("sasl.passwrd", "hunter2"), ("basic.auth.user.info", "KEY:SECRET"),
                         ("sasl.mechanisms", "PLAIN password=hunter2")):
        with pytest.raises(InvalidArgument, match=rf"invalid {name}='\(hidden\)': librdkafka "
                           ) as refused:
            make({"bootstrap.servers": "127.0.0.1:1", name: secret})  # type: ignore
        assert secret not in str(refused.value)  # librdkafka's own text repeats some
