"""A local sink path that cannot be made is named when the pipeline is built."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from redrive.errors import InvalidArgument
from redrive.spark.pipeline import check_local_sink

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
