import gc
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from redrive import headers as h
from redrive.policy import Backoff, InPlace, RetryPolicy
from redrive.record import Origin
from redrive.spark import tasks

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SOURCE = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                    ("partition", pa.int32()), ("offset", pa.int64()),
                    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
                    ("headers", HEADERS)])
OUTPUT = pa.struct([("n", pa.int64()), ("tag", pa.string())])
POLICY = RetryPolicy(backoff=Backoff.sequence("1s,2s"), not_retryable=ValueError,
                     in_place=InPlace(on=TimeoutError, retries=2, backoff=Backoff.fixed("1ms")))


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    base = {"key": b"k", "value": b"1", "topic": "orders", "partition": 0,
            "timestamp": datetime(2026, 1, 1, tzinfo=UTC), "timestampType": 0, "headers": []}
    full = [{**base, "offset": i, **row} for i, row in enumerate(rows)]
    return pa.RecordBatch.from_pylist(full, schema=SOURCE)


def run(rows: list[dict[str, Any]], function: Any) -> list[dict[str, Any]]:
    out = list(tasks.process_batches(iter([batch(rows)]), record_function=function,
                                     batch_function=None, error_column="error", policy=POLICY,
                                     group="g", output_type=OUTPUT))
    return out[0].to_pylist()


def test_success_failure_and_output_conformed_to_schema() -> None:
    def function(record: dict[str, Any]) -> dict[str, Any]:
        if record["value"] == b"bad":
            raise ValueError("bad value")
        return {"n": int(record["value"]), "tag": record["topic"], "extra": "dropped"}

    rows = run([{"value": b"7"}, {"value": b"bad"}], function)
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert rows[0]["output"] == {"n": 7, "tag": "orders"}
    assert rows[1]["output"] is None
    assert (rows[1]["error_type"], rows[1]["error_message"]) == ("ValueError", "bad value")
    assert "ValueError: bad value" in rows[1]["error_trace"]


def test_in_place_errors_are_retried_in_the_task_first() -> None:
    calls: list[int] = []

    def flaky(record: dict[str, Any]) -> dict[str, Any]:
        calls.append(record["offset"])
        if len(calls) < 3:
            raise TimeoutError("slow")
        return {"n": 1, "tag": "x"}

    rows = run([{}], flaky)
    assert rows[0]["status"] == "ok" and rows[0]["in_place"] == 2 and len(calls) == 3


def test_in_place_budget_exhausted_is_a_failure_to_route() -> None:
    def always(record: dict[str, Any]) -> dict[str, Any]:
        raise TimeoutError("slow")

    rows = run([{}], always)
    assert rows[0]["status"] == "failed" and rows[0]["in_place"] == 2


def test_records_of_another_group_are_skipped_and_malformed_ones_fail() -> None:
    other = [{"key": h.GROUP, "value": b"other"}]
    broken = [{"key": h.ATTEMPT, "value": b"many"}]
    seen: list[int] = []

    def function(record: dict[str, Any]) -> dict[str, Any]:
        seen.append(record["offset"])
        return {"n": 0, "tag": ""}

    # Another group's copy that no one can read is still that group's to dead-letter.
    others_broken = [*other, *broken]
    rows = run([{"headers": other}, {"headers": broken}, {}, {"headers": others_broken}],
               function)
    assert [r["status"] for r in rows] == ["skipped", "failed", "ok", "skipped"]
    assert rows[0]["skip_reason"] == rows[3]["skip_reason"] == "other-group"
    assert [r["handler_us"] is not None for r in rows] == [False, False, True, False]
    assert rows[1]["error_type"] == "redrive.errors.MalformedHeader"
    assert seen == [2]


def test_route_batches_sends_failures_to_retry_and_dead_letter_topics() -> None:
    rows = run([{"value": b"bad"}, {"value": b"x"}, {"value": b"y", "headers": [
        {"key": k, "value": v} for k, v in h.replace([], {
            h.ATTEMPT: 2, h.GROUP: "g", **h.origin_fields(Origin("orders", 0, 9))}).copy()]}],
        lambda r: int(r["value"]))  # ValueError for b"bad", b"x" and b"y"
    failed = pa.RecordBatch.from_pylist(rows)
    routed = next(tasks.route_batches(iter([failed]), policy=POLICY, group="g",
                                      partitions={"orders.g.retry.1s": 1, "orders.g.dlt": 1}))
    out = routed.to_pylist()
    assert [(r["topic"], r["kind"], r["reason"], r["attempt"]) for r in out] == [
        ("orders.g.dlt", "dead-letter", "not-retryable", 1),
        ("orders.g.dlt", "dead-letter", "not-retryable", 1),
        ("orders.g.dlt", "dead-letter", "not-retryable", 3),
    ]
    assert all(r["partition"] == 0 for r in out)
    pairs = [(p["key"], p["value"]) for p in out[2]["headers"]]
    assert h.read_delivery(pairs).original == Origin("orders", 0, 9)


def test_retryable_failure_gets_first_retry_topic_and_due_time() -> None:
    rows = run([{}], lambda r: (_ for _ in ()).throw(ConnectionError("down")))
    routed = next(tasks.route_batches(iter([pa.RecordBatch.from_pylist(rows)]), policy=POLICY,
                                      group="g", partitions={}))
    out = routed.to_pylist()[0]
    assert (out["topic"], out["kind"], out["attempt"]) == ("orders.g.retry.1s", "retry", 1)
    assert out["source_topic"] == rows[0]["topic"]
    assert out["partition"] is None  # topic partition count unknown: the key decides
    pairs = [(p["key"], p["value"]) for p in out["headers"]]
    due = h.read_due(pairs)
    assert due is not None and due >= rows[0]["handled_ms"] + 1000


def test_vectorized_form_with_per_row_errors() -> None:
    import pandas as pd

    def frame_function(frame: pd.DataFrame) -> pd.DataFrame:
        values = frame["value"].map(bytes)
        errors = [ValueError("odd") if int(v) % 2 else None for v in values]
        return pd.DataFrame({"n": [int(v) for v in values], "tag": "b", "error": errors})

    out = next(iter(tasks.process_batches(iter([batch([{"value": b"2"}, {"value": b"3"}])]),
                                     record_function=None, batch_function=frame_function,
                                     error_column="error", policy=POLICY, group="g",
                                     output_type=OUTPUT))).to_pylist()
    assert [r["status"] for r in out] == ["ok", "failed"]
    assert out[0]["output"] == {"n": 2, "tag": "b"}
    assert out[1]["error_message"] == "odd"


def test_vectorized_function_that_raises_fails_every_row() -> None:
    def broken(frame: Any) -> Any:
        raise RuntimeError("whole batch")

    out = next(iter(tasks.process_batches(iter([batch([{}, {}])]), record_function=None,
                                     batch_function=broken, error_column="error", policy=POLICY,
                                     group="g", output_type=OUTPUT))).to_pylist()
    assert [r["error_message"] for r in out] == ["whole batch", "whole batch"]


def test_records_the_backend_refused_are_skipped_with_its_reason() -> None:
    out = next(iter(tasks.process_batches(iter([batch([{}, {}])]), record_function=lambda r: {},
                                     batch_function=None, error_column="error", policy=POLICY,
                                     group="g", output_type=OUTPUT,
                                     skip={("orders", 0, 1): "duplicate"}))).to_pylist()
    assert [(r["status"], r["skip_reason"]) for r in out] == [("ok", None),
                                                              ("skipped", "duplicate")]


@contextmanager
def cyclic_garbage() -> Iterator[Callable[[], int]]:
    """Counts what only the cyclic collector would free of what the block left behind."""
    gc.collect()
    gc.disable()
    try:
        yield gc.collect
    finally:
        gc.enable()


def test_failed_rows_leave_no_reference_cycles() -> None:
    # A live exception kept in the frame that caught it is a cycle through its traceback; with
    # thousands of failed rows per batch the collector's full passes cost more than the rows.
    def function(record: dict[str, Any]) -> dict[str, Any]:
        kind = [ConnectionError, ValueError, TimeoutError][record["offset"] % 3]
        raise kind(f"row {record['offset']}")

    def broken(frame: Any) -> Any:
        raise RuntimeError("whole batch")

    # Once before counting: the first run imports what the tasks import lazily (numpy.ma builds
    # its functions' signatures, leaving cycles), which would count here when this test runs first.
    run([{}], function)
    with cyclic_garbage() as collect:
        rows = run([{}] * 30, function)
        vectorized = next(iter(tasks.process_batches(
            iter([batch([{}] * 5)]), record_function=None, batch_function=broken,
            error_column="error", policy=POLICY, group="g", output_type=OUTPUT)))
        left = collect()
    assert [r["status"] for r in rows] == ["failed"] * 30
    assert [r["in_place"] for r in rows[:3]] == [0, 0, 2]
    assert vectorized.num_rows == 5
    assert left == 0


def test_failures_are_read_column_by_column_with_each_distinct_error_decoded_once() -> None:
    def function(record: dict[str, Any]) -> dict[str, Any]:
        raise (ConnectionError("down") if record["offset"] % 2 else ValueError("bad"))

    stamp = datetime(2026, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
    rows = run([{"key": None, "value": b"v0", "timestamp": stamp},
                {"value": None, "headers": [{"key": "h", "value": None}]},
                {"key": b"k2"}, {}], function)
    failed = pa.RecordBatch.from_pylist(rows).select(list(tasks.ROUTING_COLUMNS))
    routed: set[tasks.Coordinates] = set()
    read = list(tasks.failures(failed, routed))
    assert [(r.offset, r.key, r.value, r.headers) for r, _ in read] == [
        (0, None, b"v0", []), (1, b"k", None, [("h", None)]), (2, b"k2", b"1", []),
        (3, b"k", b"1", [])]
    assert read[0][0].timestamp_ms == int(stamp.timestamp() * 1000)
    assert [(e.type_name, e.message) for _, e in read] == [
        ("ValueError", "bad"), ("ConnectionError", "down")] * 2
    assert read[0][1].chain == (("ValueError", "Exception", "BaseException"),)
    # Rows sharing an error share its decoded form: the chain is parsed once per batch.
    assert read[0][1] is read[2][1] and read[1][1] is read[3][1]
    assert all(record == tasks.record_of(row) for (record, _), row in zip(read, rows,
                                                                           strict=True))
    # A record read before, in this batch or an earlier one of the task, is not read again:
    # a transform that made several rows of it failed more than one.
    assert routed == {("orders", 0, offset) for offset in range(4)}
    again = pa.concat_batches([failed.slice(2, 1), failed.slice(2, 1)])
    assert list(tasks.failures(again, routed)) == []
    assert [r.offset for r, _ in tasks.failures(again, set())] == [2]


def test_routing_leaves_the_collector_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = run([{}], lambda r: (_ for _ in ()).throw(ConnectionError("down")))
    failed = pa.RecordBatch.from_pylist(rows).select(list(tasks.ROUTING_COLUMNS))
    seen: list[bool] = []
    original = tasks._routed

    def spy(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return original(*args)

    monkeypatch.setattr(tasks, "_routed", spy)
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            next(tasks.route_batches(iter([failed]), policy=POLICY, group="g", partitions={}))
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen == [False, False]


def test_an_output_the_schema_cannot_hold_fails_its_record_naming_why() -> None:
    """Each was a row of nulls written as a success, a query failed by Arrow's conversion
    error, or a TypeError about iterating None."""
    outputs: dict[bytes, Any] = {b"ok": {"n": 1, "tag": "t", "topic": "passed through"},
                                 b"empty": {}, b"renamed": {"N": 2, "Tag": "t"},
                                 b"wrong": {"n": "abc-0", "tag": "t"}, b"none": None,
                                 b"number": 42}
    rows = run([{"value": value} for value in outputs], lambda r: outputs[r["value"]])
    found = {value: (r["status"], r["output"], r["error_type"], r["error_message"])
             for value, r in zip(outputs, rows, strict=True)}
    assert found[b"ok"] == ("ok", {"n": 1, "tag": "t"}, None, None)
    assert found[b"empty"] == ("ok", {"n": None, "tag": None}, None, None)
    mismatch = "redrive.errors.OutputMismatch"
    assert found[b"renamed"] == ("failed", None, mismatch, "the output holds none of "
                                 "output_schema's fields (n, tag): it has ['N', 'Tag']")
    assert found[b"wrong"][:3] == ("failed", None, mismatch)
    assert found[b"wrong"][3].startswith("output field 'n' = 'abc-0' does not fit "
                                         "output_schema's int64: ")
    assert found[b"none"] == ("failed", None, mismatch, "the function returned NoneType, not "
                              "a mapping of output_schema's fields")
    assert found[b"number"][3] == ("the function returned int, not a mapping of "
                                   "output_schema's fields")
    # A TypeError in the record's chain: a policy can classify it as not retryable.
    assert "TypeError" in json.loads(rows[2]["error_chain"])[0]


def test_a_batch_function_output_that_does_not_fit_fails_only_its_rows() -> None:
    import pandas as pd

    def function(frame: Any) -> Any:
        return pd.DataFrame({"n": [1, "x"], "tag": ["a", "b"]})

    out = next(iter(tasks.process_batches(iter([batch([{}, {}])]), record_function=None,
                                          batch_function=function, error_column="error",
                                          policy=POLICY, group="g", output_type=OUTPUT)))
    rows = out.to_pylist()
    assert [(r["status"], r["output"]) for r in rows] == [("ok", {"n": 1, "tag": "a"}),
                                                          ("failed", None)]
    assert rows[1]["error_message"].startswith("output field 'n' = 'x' does not fit")


def test_a_float_with_a_fraction_in_an_integer_field_fails_its_record() -> None:
    # Arrow would write 1.5 into a long field as 1; a whole float (2.0) fits.
    rows = run([{"value": b"1.5"}, {"value": b"2.0"}],
               lambda record: {"n": float(record["value"]), "tag": "t"})
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert rows[0]["error_type"] == "redrive.errors.OutputMismatch"
    assert "output field 'n' = 1.5 does not fit" in rows[0]["error_message"]
    assert rows[1]["output"] == {"n": 2, "tag": "t"}


def test_pandas_missing_values_are_nulls_in_the_error_column_and_the_outputs() -> None:
    import pandas as pd

    def function(frame: Any) -> Any:
        numbers = pd.to_numeric(frame["value"].map(bytes.decode), errors="coerce")
        return pd.DataFrame({
            "n": numbers.astype("Int64"),
            "tag": pd.Series([float("nan"), None, "x"], dtype=object),  # NaN: missing
            "error": pd.array([None, "not a number", None], dtype="string"),  # pd.NA: none
        }).convert_dtypes()

    out = next(iter(tasks.process_batches(
        iter([batch([{"value": b"1"}, {"value": b"x"}, {"value": b"3"}])]), record_function=None,
        batch_function=function, error_column="error", policy=POLICY, group="g",
        output_type=OUTPUT))).to_pylist()
    assert [r["status"] for r in out] == ["ok", "failed", "ok"]
    assert [r["output"] for r in out] == [{"n": 1, "tag": None}, None, {"n": 3, "tag": "x"}]
    assert (out[1]["error_type"], out[1]["error_message"]) == ("Error", "not a number")
