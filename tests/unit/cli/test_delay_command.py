from __future__ import annotations

from click.testing import CliRunner

from redrive.cli.delay import delay_command


def test_run_names_a_bad_tier_list_without_a_traceback() -> None:
    result = CliRunner().invoke(delay_command, ["run", "-b", "127.0.0.1:1", "--tiers", "1s,soon"])
    assert result.exit_code == 1
    assert "invalid tier='soon'" in result.output
    assert "Traceback" not in result.output


def test_run_names_a_client_setting_that_is_not_key_value() -> None:
    result = CliRunner().invoke(delay_command, ["run", "-b", "127.0.0.1:1",
                                                "--consumer-config", "fetch.wait.max.ms"])
    assert result.exit_code == 2
    assert "'fetch.wait.max.ms': expected KEY=VALUE" in result.output
