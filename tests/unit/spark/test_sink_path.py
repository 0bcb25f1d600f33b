"""A local sink path that cannot be made is named when the pipeline is built; a sink table's
columns are matched to the output's by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from redrive.errors import InvalidArgument
from redrive.spark.batches import _sink_columns
from redrive.spark.pipeline import check_local_sink
from redrive.spark.sql import quoted

LOCAL = "file:///"  # Hadoop's default file system on a local session


def test_a_sink_under_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for sink in (f"{tmp_path}/afile/sink", f"file://{tmp_path}/afile/sink/deeper",
                 f"{tmp_path}/afile"):
        with pytest.raises(InvalidArgument,
                           match=rf"invalid sink=.*: {tmp_path}/afile is a file, not a directory"):
            check_local_sink(sink, LOCAL)


def test_a_sink_in_a_folder_it_cannot_write_is_named(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root here, who may write anywhere: the answer of access(2) is played.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(InvalidArgument, match=f"{tmp_path} is not writable by this process"):
        check_local_sink(f"{tmp_path}/sink", LOCAL)


def test_paths_that_can_be_made_tables_and_other_file_systems_pass(tmp_path: Path) -> None:
    for sink in (f"{tmp_path}/new/sink", f"file:{tmp_path}/x", "relative/sink", "orders_table",
                 "s3a://lake/orders", "hdfs://nn/afile/sink"):
        check_local_sink(sink, LOCAL)
    assert not (tmp_path / "new").exists()  # nothing is made by the check


def test_a_path_without_scheme_on_a_cluster_s_file_system_is_not_checked(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    # Resolved against fs.defaultFS (HDFS here), not the driver's disk.
    check_local_sink(f"{tmp_path}/afile/sink", "hdfs://namenode:8020")
    with pytest.raises(InvalidArgument, match="is a file, not a directory"):
        check_local_sink(f"file:{tmp_path}/afile/sink", "hdfs://namenode:8020")


def test_a_sink_tables_columns_take_the_outputs_by_name_in_the_tables_order() -> None:
    table = ["Offset", "key", "redrive_query", "redrive_batch"]
    assert _sink_columns("t", table, ["key", "offset"]) == ["offset", "key"]
    with pytest.raises(InvalidArgument, match=r"invalid sink='t': the table's columns "
                       r"\['Offset', 'key'\] are not the output's \['key', 'extra'\]: "
                       r"missing from the output \['Offset'\], not in the table \['extra'\]"):
        _sink_columns("t", table, ["key", "extra"])
    assert quoted("we`ird") == "`we``ird`"
