from click.testing import CliRunner

from redrive.cli import cli


def test_topics_plan_prints_the_seed_plan() -> None:
    result = CliRunner().invoke(cli, ["topics", "plan", "--topic", "orders", "--group", "billing",
                                      "--backoff", "5m,5m,30m,30m,30m,1h"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:] if line.strip()}
    assert rows["orders.billing.retry.5m"] == ["retry", "5m", "attempts", "2,", "3"]
    assert rows["orders.billing.retry.30m"] == ["retry", "30m", "attempts", "4,", "5,", "6"]
    assert rows["orders.billing.retry.1h"] == ["retry", "1h", "attempts", "7"]
    assert rows["orders.billing.dlt"][0] == "dead-letter"


def test_invalid_policy_is_one_clear_line() -> None:
    result = CliRunner().invoke(cli, ["topics", "plan", "--topic", "orders", "--group", "b",
                                      "--backoff", "5m,soon"])
    assert result.exit_code == 2
    assert "backoff.sequence[1]='soon'" in result.output
    assert "Traceback" not in result.output
