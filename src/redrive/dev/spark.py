"""Starts and stops a local Spark Connect server and a Spark standalone cluster, from the pyspark
wheel.

For tests, benchmarks and the demo only; redrive never starts Spark in production. The pyspark
wheel is a Spark distribution: its package dir is SPARK_HOME, with the launcher scripts in bin/
and every jar, the Connect server's included, in jars/. Nothing is downloaded.

Each JVM runs in the foreground in a new session (`spark-submit` and `spark-class` exec java, so
the pid is the JVM's and its process group holds everything it starts: executors, Python workers).
Stopping sends SIGTERM to the whole group, because a Connect server's foreachBatch worker was seen
outliving the JVM's own shutdown, then SIGKILL to what is left after a grace period. Everything
binds 127.0.0.1 on free ports: Spark's defaults (15002, 4040, 6066, 7077, 8080) would listen on
every interface and collide between two test runs.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from redrive.dev.lifetime import end_group, tied_to_parent
from redrive.dev.ports import HOST, free_port, held_by, port_in_use
from redrive.errors import RedriveError

STOP_GRACE_S = 30.0
LOG_TAIL_CHARS = 3000
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Logged at INFO only, so not with the server's default spark.log.level.
_CONNECT_STARTED = re.compile(r"Spark Connect server started at:? \S*:(\d+)")
_SERVICE_BOUND = re.compile(r"Successfully started service '([^']+)' on port (\d+)")
# Variables that would turn the JVM's own Python workers into Connect clients of something else,
# or point spark-submit at another master.
CLIENT_ONLY_ENV = ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                   "SPARK_API_MODE", "MASTER", "PYSPARK_SUBMIT_ARGS")


class DevSparkError(RedriveError):
    """A development Spark server could not be found, started or kept running."""


def spark_home() -> Path:
    """The installed pyspark package dir, which holds bin/ and jars/ like a Spark distribution."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise DevSparkError("pyspark is not installed; install redrive's spark extra "
                            "(pip install -e '.[spark]')")
    home = Path(next(iter(spec.submodule_search_locations)))
    for script in ("spark-submit", "spark-class"):
        path = home / "bin" / script
        if not os.access(path, os.X_OK):
            raise DevSparkError(f"{path} is missing or not executable: the pyspark install at "
                                f"{home} is not a usable Spark distribution")
    return home


def spark_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a Spark JVM: this interpreter for its Python workers (the system one
    lacks pyarrow, grpcio and redrive) and the loopback address for everything it binds."""
    env = {name: value for name, value in os.environ.items() if name not in CLIENT_ONLY_ENV}
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP=HOST)
    env.update(extra)
    return env


def port_accepts(port: int, timeout_s: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        return probe.connect_ex((HOST, port)) == 0


_RUNNING: set[SparkProcess] = set()


@atexit.register
def _stop_all() -> None:
    for process in list(_RUNNING):
        process.stop(grace_s=10.0)


class SparkProcess:
    """One JVM started by a Spark launcher script, in its own session, its output in `log_path`.

    Start it from a thread that outlives it (the main thread, normally): on Linux the kernel ends
    the JVM when the thread that started it exits.
    """

    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str],
                 log_path: Path, cwd: Path) -> None:
        self.name = name
        self.command = list(command)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None
        # Where this launch's lines begin: the log is appended to, and an earlier run's lines
        # must not count for this one.
        self._log_start = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"SparkProcess({self.name!r}, {state}, log={self.log_path})"

    def launch(self) -> None:
        if self.running:
            raise DevSparkError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_start = log.tell()
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {self.command_line}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                tied_to_parent(self.command), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env, start_new_session=True)
        _RUNNING.add(self)

    @property
    def command_line(self) -> str:
        return " ".join(self.command)

    def raise_if_exited(self) -> None:
        process = self._process
        if process is not None and process.poll() is not None:
            self.stop()
            raise DevSparkError(f"{self.name} exited with code {process.returncode} at start; "
                                f"command: {self.command_line}; {self.log_tail()}")

    def not_ready(self, timeout_s: float, why: str) -> DevSparkError:
        return DevSparkError(f"{self.name} (pid {self.pid}) was not ready within {timeout_s}s: "
                             f"{why}; command: {self.command_line}; {self.log_tail()}")

    def log_text(self) -> str:
        """What the last launch wrote to the log."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self) -> str:
        if not self.log_path.exists():
            return f"no log at {self.log_path}"
        return f"end of {self.log_path}:\n{self.log_text()[-LOG_TAIL_CHARS:]}"

    def bound_port(self, service: str) -> int | None:
        """The port this launch's log says `service` bound last: Spark moves a service to the
        next port when its own is taken."""
        ports = [int(port) for name, port in _SERVICE_BOUND.findall(self.log_text())
                 if name == service]
        return ports[-1] if ports else None

    def listens_on(self, port: int) -> bool:
        """Whether the listener on `port` is this process's; where /proc cannot tell, whether
        anything accepts there while this process runs."""
        pid = self.pid
        if pid is None:
            return False
        held = held_by(pid, port)
        return held if held is not None else port_accepts(port) and self.running

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group (the JVM's shutdown hooks stop its queries and delete its
        temp dirs), then SIGKILL it when the JVM has not exited after grace_s or other members
        have not followed it within LEFTOVER_GRACE_S."""
        if self._process is None:
            return
        end_group(self._process, grace_s)
        self._process = None
        _RUNNING.discard(self)


def _check_ports_free(name: str, ports: Sequence[int]) -> None:
    for port in ports:
        busy = port_in_use(port)
        if busy is not None:
            raise DevSparkError(f"port {port} on {HOST} for {name} is already in use "
                                f"({busy.strerror})")


def _check_timeout(timeout_s: float) -> None:
    if timeout_s <= 0:
        raise ValueError(f"invalid timeout_s={timeout_s!r}: must be > 0")


class ConnectServer:
    """A Spark Connect server (`spark-submit --class SparkConnectServer`) on 127.0.0.1.

    work_dir holds its log (`connect-server.log`) and spark.local.dir. master is where the
    server's driver runs its jobs: `local[2]` by default (one JVM), or a standalone cluster's
    `master_url`. confs are extra `--conf` settings, for instance spark.sql.session.timeZone.
    The server's Python workers run this interpreter, so they import what it imports (redrive
    among them) and the Connect client packages its foreachBatch worker needs.
    """

    def __init__(self, work_dir: Path | str, *, master: str = "local[2]",
                 port: int | None = None, confs: Mapping[str, str] | None = None,
                 name: str = "redrive-connect") -> None:
        self.work_dir = Path(work_dir).resolve()
        self.master = master
        self.port = port or free_port()
        self.confs = dict(confs or {})
        self.app_name = name
        self.home = spark_home()
        self.log_path = self.work_dir / "connect-server.log"
        self._jvm = SparkProcess("Spark Connect server", self.command(), spark_env(self.home),
                                 self.log_path, self.work_dir)

    @property
    def remote(self) -> str:
        """The URL for `SparkSession.builder.remote(...)`."""
        return f"sc://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._jvm.pid

    @property
    def running(self) -> bool:
        return self._jvm.running

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"ConnectServer({self.remote}, master={self.master}, {state}, log={self.log_path})"

    def command(self) -> list[str]:
        settings = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.ui.enabled": "false",
            "spark.local.dir": str(self.work_dir / "local"),
            # About 50 lines of log instead of about 1,400.
            "spark.log.level": "WARN",
            **self.confs,
        }
        command = [str(self.home / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS,
                   "--name", self.app_name, "--master", self.master]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        return command

    def start(self, timeout_s: float = 120.0) -> ConnectServer:
        """Launch the server and return once it accepts Connect clients."""
        _check_timeout(timeout_s)
        _check_ports_free("the Spark Connect server", [self.port])
        (self.work_dir / "local").mkdir(parents=True, exist_ok=True)
        self._jvm.launch()
        try:
            self._wait_ready(time.monotonic() + timeout_s, timeout_s)
        except BaseException:
            self._jvm.stop()
            raise
        return self

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        # The gRPC service starts after the SparkContext, so our JVM's listener means ready; an
        # open port alone may be another process's, bound while the JVM was booting.
        while True:
            self._jvm.raise_if_exited()
            if self._jvm.listens_on(self.port) or self._started_port() == self.port:
                return
            if time.monotonic() > deadline:
                raise self._jvm.not_ready(timeout_s, f"nothing accepts on {HOST}:{self.port}")
            time.sleep(0.2)

    def _started_port(self) -> int | None:
        started = _CONNECT_STARTED.findall(self._jvm.log_text())
        return int(started[-1]) if started else None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self._jvm.stop(grace_s)

    def __enter__(self) -> ConnectServer:
        if not self.running:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class StandaloneCluster:
    """A Spark standalone cluster: one master and one worker (`spark-class ...Master/Worker`).

    Everything is on 127.0.0.1 with free ports; the master's REST submission server (port 6066
    on every interface by default) is off. work_dir holds both logs and the worker's dir, where
    each application's executor stdout and stderr land (by default that dir is SPARK_HOME/work,
    inside the pyspark package). Executors run the driver's PYSPARK_PYTHON, so an application
    that sets it to this interpreter finds redrive there.
    """

    def __init__(self, work_dir: Path | str, *, cores: int = 1, memory: str = "1g") -> None:
        if isinstance(cores, bool) or cores < 1:
            raise ValueError(f"invalid cores={cores!r}: must be >= 1")
        self.work_dir = Path(work_dir).resolve()
        self.cores = cores
        self.memory = memory
        self.home = spark_home()
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.worker_port = free_port()
        self.worker_ui_port = free_port()
        self.worker_dir = self.work_dir / "work"
        env = spark_env(self.home, SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                        SPARK_WORKER_DIR=str(self.worker_dir))
        spark_class = str(self.home / "bin" / "spark-class")
        self._master = SparkProcess(
            "Spark master",
            [spark_class, MASTER_CLASS, "--host", HOST, "--port", str(self.master_port),
             "--webui-port", str(self.master_ui_port)],
            env, self.work_dir / "master.log", self.work_dir)
        self._worker = SparkProcess(
            "Spark worker",
            [spark_class, WORKER_CLASS, self.master_url, "--host", HOST,
             "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
             "--cores", str(cores), "--memory", memory, "--work-dir", str(self.worker_dir)],
            env, self.work_dir / "worker.log", self.work_dir)

    @property
    def master_url(self) -> str:
        """The URL for `SparkSession.builder.master(...)` or `spark-submit --master`."""
        return f"spark://{HOST}:{self.master_port}"

    @property
    def ui_url(self) -> str:
        # The port chosen free can be taken by another process before the master binds it;
        # Spark then moves its UI to the next port and says so in its log (seen in CI: the
        # chosen port answered 401 from another server).
        return f"http://{HOST}:{self._master.bound_port('MasterUI') or self.master_ui_port}"

    @property
    def pids(self) -> tuple[int | None, int | None]:
        """(master, worker)."""
        return self._master.pid, self._worker.pid

    @property
    def running(self) -> bool:
        return self._master.running and self._worker.running

    def __repr__(self) -> str:
        state = f"pids {self.pids}" if self.running else "stopped"
        return f"StandaloneCluster({self.master_url}, {state}, work_dir={self.work_dir})"

    def start(self, timeout_s: float = 120.0) -> StandaloneCluster:
        """Launch the master, then the worker; return once the master counts the worker alive.

        The worker starts only when the master accepts connections: one that finds no master
        retries registration only after several seconds.
        """
        _check_timeout(timeout_s)
        _check_ports_free("the Spark standalone cluster",
                          [self.master_port, self.master_ui_port, self.worker_port,
                           self.worker_ui_port])
        self.worker_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        try:
            self._master.launch()
            self._wait_master(deadline, timeout_s)
            self._worker.launch()
            self._wait_worker(deadline, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_master(self, deadline: float, timeout_s: float) -> None:
        while not self._master.listens_on(self.master_port):
            self._master.raise_if_exited()
            moved = self._master.bound_port("sparkMaster")
            if moved is not None and moved != self.master_port:
                raise DevSparkError(f"the Spark master bound port {moved}, not {self.master_port}"
                                    f" (taken before it started); {self._master.log_tail()}")
            if time.monotonic() > deadline:
                raise self._master.not_ready(
                    timeout_s, f"nothing accepts on {HOST}:{self.master_port}")
            time.sleep(0.2)

    def _wait_worker(self, deadline: float, timeout_s: float) -> None:
        last = "no answer yet"
        while True:
            self._master.raise_if_exited()
            self._worker.raise_if_exited()
            try:
                state = self.master_state()
                alive = int(state.get("aliveworkers", 0))
                if alive >= 1:
                    return
                last = f"{self.ui_url}/json/ reports {alive} alive workers"
            except (OSError, ValueError) as exc:
                last = f"{self.ui_url}/json/ did not answer: {exc}"
            if time.monotonic() > deadline:
                raise self._worker.not_ready(
                    timeout_s, f"{last}; the master's {self._master.log_tail()}")
            time.sleep(0.2)

    def master_state(self) -> dict[str, Any]:
        """The master's /json/ status: aliveworkers, workers, activeapps, ..."""
        # No proxy: an http_proxy in the environment must not see loopback requests.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.ui_url}/json/", timeout=2) as response:
            state = json.load(response)
        if not isinstance(state, dict):
            raise ValueError(f"unexpected /json/ answer: {state!r}")
        return state

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Worker first (it takes its executors with it), then the master."""
        self._worker.stop(grace_s)
        self._master.stop(grace_s)

    def __enter__(self) -> StandaloneCluster:
        if not self.running:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
