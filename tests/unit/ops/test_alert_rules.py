"""The example Prometheus alert rules load, every series they name is one redrive exports, and
each alert fires when it should and only then (promtool's unit tests, alert_rules_test.yml)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from redrive.metrics import Metrics

RULES = Path(__file__).resolve().parents[3] / "ops" / "prometheus" / "redrive-alerts.yml"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yml")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
FUNCTIONS = {"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "delta",
             "histogram_quantile", "by", "without", "on", "ignoring", "and", "or", "unless",
             "absent", "le", "bool", "offset", "clamp_min", "time", "changes"}
KNOWN_LABELS = {"runtime", "group", "topic", "attempt", "reason", "why", "kind", "le"}
SEVERITIES = {"info", "warning", "critical"}


def exported_series() -> set[str]:
    """Every sample name a Metrics registry exposes, once each metric has a child."""
    metrics = Metrics("consumer", "g")
    metrics.processed("t")
    metrics.retried("t", 1)
    metrics.dead_lettered("t", "exhausted")
    metrics.skipped("t", "other-group")
    metrics.replayed("t")
    metrics.forwarded("t")
    metrics.retried_in_place("t")
    metrics.rebalanced("assign")
    metrics.late_by(1)
    metrics.handler_took(1)
    metrics.paused_partitions(1)
    metrics.oldest_pending_retry_since(1)
    metrics.broker_up(True)
    metrics.lost("t", 1)
    metrics.notification_given_up()
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def series_named(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions or labels."""
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)|\boffset\s+\w+", "", expr)
    bare = re.sub(r"\[[^\]]*\]|\{[^}]*\}", "", bare)
    return {name for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)
            if name not in FUNCTIONS}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    found: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert group["name"] and group["rules"]
        found += group["rules"]
    return found


def test_rules_load_with_the_fields_prometheus_needs() -> None:
    loaded = rules()
    names = [rule["alert"] for rule in loaded]
    assert len(names) == len(set(names)) >= 4
    for rule in loaded:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert DURATION.match(rule["for"]), rule["for"]
        assert rule["labels"]["severity"] in SEVERITIES
        assert rule["annotations"]["summary"]


def test_expressions_are_sane_and_name_only_exported_series() -> None:
    series = exported_series()
    used: set[str] = set()
    for rule in rules():
        expr = rule["expr"]
        assert balanced(expr), rule["alert"]
        assert re.search(r"[<>]=?\s*[\d.]+\s*$", expr.strip()), f"{rule['alert']}: no threshold"
        for window in re.findall(r"\[([^\]]*)\]", expr):
            assert DURATION.match(window), f"{rule['alert']}: range [{window}]"
        for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert labels <= KNOWN_LABELS, f"{rule['alert']}: labels {labels - KNOWN_LABELS}"
        named = series_named(expr)
        assert named <= series, f"{rule['alert']}: {named - series} not in redrive.metrics"
        used |= named
    # The issues' alerts: stuck retries, rising dead letters, rebalance storms, lateness, and
    # brokers out of reach.
    assert {"redrive_oldest_pending_retry_seconds", "redrive_dead_lettered_total",
            "redrive_rebalances_total", "redrive_lateness_seconds_bucket",
            "redrive_broker_up"} <= used


def test_the_sanity_check_catches_mistakes() -> None:
    expr = 'sum by (group) (rate(redrive_dead_letters_total{reason="x"}[5m])) > 1'
    assert series_named(expr) - exported_series() == {"redrive_dead_letters_total"}
    assert not balanced("sum(rate(redrive_processed_total[5m])")


def test_each_alert_fires_when_it_should_and_only_then() -> None:
    # Debian's promtool (`make promtool`), evaluating the rules over series as runtimes export
    # them: a deploy failing every record (no success series at all), a loss counted as a runtime
    # takes its partitions (a series born counting it), a rolling restart of three members.
    done = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
