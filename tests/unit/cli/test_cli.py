import pytest
from click.testing import CliRunner, Result

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


def plan_rows(result: Result) -> dict[str, list[str]]:
    """The rows of `topics plan`'s table by topic: what comes before the blank line."""
    assert result.exit_code == 0, result.output
    table = result.output.split("\n\n")[0].splitlines()[2:]
    return {line.split()[0]: line.split()[1:] for line in table}


def test_topics_plan_for_a_spark_pipeline_shows_its_batch_ledger() -> None:
    args = ["topics", "plan", "--topic", "orders", "--group", "billing", "--backoff", "1s"]
    assert "redrive.pipeline.billing" not in plan_rows(CliRunner().invoke(cli, args))
    rows = plan_rows(CliRunner().invoke(cli, [*args, "--spark"]))
    assert rows["redrive.pipeline.billing"][:2] == ["batch", "ledger"]
    assert "(1 partition)" in " ".join(rows["redrive.pipeline.billing"])


def test_topics_plan_with_an_exponential_backoff() -> None:
    result = CliRunner().invoke(cli, ["topics", "plan", "--topic", "orders", "--group", "billing",
                                      "--exponential", "1s", "--multiplier", "3",
                                      "--max-delay", "10s", "--attempts", "6"])
    assert plan_rows(result) == {
        "orders": ["main", "first", "delivery"],
        "orders.billing.retry.1s": ["retry", "1s", "attempts", "2"],
        "orders.billing.retry.3s": ["retry", "3s", "attempts", "3"],
        "orders.billing.retry.9s": ["retry", "9s", "attempts", "4"],
        # 27s and 81s, capped by --max-delay: one topic for both.
        "orders.billing.retry.10s": ["retry", "10s", "attempts", "5,", "6"],
        "orders.billing.dlt": ["dead-letter", "after", "the", "last", "attempt"],
    }
    assert "policy: exponential 1s x3 max 10s, attempts 6" in result.output


def test_topics_plan_per_attempt_without_a_dead_letter_topic() -> None:
    args = ["topics", "plan", "--topic", "orders", "--group", "billing", "--exponential", "1s",
            "--attempts", "3", "--naming", "per-attempt"]
    assert "orders.billing.dlt" in plan_rows(CliRunner().invoke(cli, args))
    rows = plan_rows(CliRunner().invoke(cli, [*args, "--no-dlt"]))
    assert list(rows) == ["orders", "orders.billing.retry.1", "orders.billing.retry.2"]
    assert rows["orders.billing.retry.2"] == ["retry", "2s", "attempts", "3"]


POLICY_ERRORS = [
    (["--exponential", "1s", "--multiplier", "0"], "invalid backoff.multiplier=0.0"),
    (["--attempts", "0"], "invalid attempts=0"),
    (["--exponential", "soon"], "invalid backoff.initial='soon'"),
    (["--backoff", "5s,10s", "--attempts", "5"], "invalid attempts=5"),
]
# The policy options are read before any broker is asked, so none is needed here.
NO_BROKER = ["-b", "127.0.0.1:1", "--timeout", "1"]


@pytest.mark.parametrize("command", [
    ["topics", "plan", "--topic", "orders", "--group", "billing"],
    ["stats", *NO_BROKER, "--topic", "orders", "--group", "billing", "--window", "0"],
    ["dlt", "replay", *NO_BROKER, "--topic", "orders", "--group", "billing", "--dry-run"],
])
@pytest.mark.parametrize(("policy", "message"), POLICY_ERRORS)
def test_an_invalid_policy_option_is_one_line_naming_field_and_value(
        command: list[str], policy: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, [*command, *policy])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}: "), result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("command", [
    ["topics", "plan", "--topic", "orders", "--group", "billing"],
    ["stats", *NO_BROKER, "--topic", "orders", "--group", "billing"],
    ["dlt", "replay", *NO_BROKER, "--topic", "orders", "--group", "billing"],
])
def test_backoff_and_exponential_together_is_a_usage_error(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--backoff", "5s", "--exponential", "1s"])
    assert result.exit_code == 2
    assert "give either --backoff or --exponential, not both" in result.stderr


@pytest.mark.parametrize("command", [
    ["topics", "plan", "--topic", "orders", "--group", "billing"],
    ["stats", *NO_BROKER, "--topic", "orders", "--group", "billing", "--attempts", "3"],
    ["stats", *NO_BROKER, "--topic", "orders", "--group", "billing"],
    ["dlt", "replay", *NO_BROKER, "--topic", "orders", "--group", "billing"],
])
@pytest.mark.parametrize(("given", "option"), [
    (["--backoff", "5s", "--max-delay", "1s"], "--max-delay"),
    (["--multiplier", "9"], "--multiplier"),
    (["--backoff", "5s", "--multiplier", "2"], "--multiplier"),
])
def test_exponential_shapes_without_exponential_are_a_usage_error(
        command: list[str], given: list[str], option: str) -> None:
    # They were ignored: a fixed 5s plan was printed for a 1s cap.
    result = CliRunner().invoke(cli, [*command, *given])
    assert result.exit_code == 2, result.output
    assert f"{option} needs --exponential" in result.stderr
    assert result.stdout == ""


def test_replay_to_the_original_takes_no_policy() -> None:
    result = CliRunner().invoke(cli, ["dlt", "replay", *NO_BROKER, "--topic", "orders",
                                      "--group", "billing", "--to", "original",
                                      "--exponential", "1s"])
    assert result.exit_code == 2
    assert "--to original takes no --to-topic, --backoff, --exponential or --attempts" \
        in result.stderr


def test_topics_plan_through_the_delay_queue_has_no_retry_topics() -> None:
    args = ["topics", "plan", "--topic", "orders", "--group", "billing",
            "--backoff", "5m,5m,30m,1h", "--delay-queue", "1s,1m,10m,1h", "--delay-prefix", "dq"]
    result = CliRunner().invoke(cli, args)
    rows = plan_rows(result)
    assert list(rows) == ["orders", "dq.1s", "dq.1m", "dq.10m", "dq.1h", "dq.dlt",
                          "orders.billing.dlt"]
    assert rows["dq.10m"][:4] == ["delay", "tier", "(shared)", "10m"]
    assert "retries wait 5m, 5m, 30m, 1h in the tiers, then return to orders" in result.output
    # the same group with its own retry topics, for contrast
    assert "orders.billing.retry.5m" in plan_rows(CliRunner().invoke(cli, args[:8]))


def test_topics_plan_with_bad_delay_tiers_names_them() -> None:
    result = CliRunner().invoke(cli, ["topics", "plan", "--topic", "orders", "--group", "b",
                                      "--delay-queue", "1s,,1m"])
    assert result.exit_code != 0 and "tiers='1s,,1m'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("timeout", ["-1", "0", "soon", "nan", "1e12"])
@pytest.mark.parametrize("command", [
    ["dlt", "ls", "--dlt-topic", "orders.billing.dlt"],
    ["stats", "--topic", "orders", "--group", "billing"],
    ["resume", "--group", "billing"],
])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_before_connecting(
        command: list[str], timeout: str) -> None:
    # -1 made librdkafka wait forever on a broker that is down.
    result = CliRunner().invoke(cli, [*command, "-b", "127.0.0.1:1", "--timeout", timeout])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--timeout'" in result.stderr
    # nan passed click's FloatRange, and 1e12 s overflowed librdkafka's wait: both then read
    # as a broker that is down.
    assert (f"{timeout!r}: expected seconds above 0, at most 3600" if timeout != "soon" else
            "'soon' is not a number of seconds") in result.stderr
