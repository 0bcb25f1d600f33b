"""StandaloneCluster finds its master's UI where Spark bound it, not only where it was asked to."""

from __future__ import annotations

from pathlib import Path

from redrive.dev.spark import StandaloneCluster


def test_the_master_ui_is_found_on_the_port_spark_moved_it_to(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path)
    asked = cluster.master_ui_port
    assert cluster.ui_url == f"http://127.0.0.1:{asked}"  # no log yet: the port asked for
    (tmp_path / "master.log").write_text(
        f"WARN Utils: Service 'MasterUI' could not bind on port {asked}. "
        f"Attempting port {asked + 1}.\n"
        f"INFO Utils: Successfully started service 'MasterUI' on port {asked + 1}.\n")
    assert cluster.ui_url == f"http://127.0.0.1:{asked + 1}"
