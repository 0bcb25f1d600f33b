"""What more than one bench script measures with: percentiles, and the broker's CPU time and
a wait for it to go idle."""

from __future__ import annotations

import math
import os
import time


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least `fraction` of the values at
    or below it (p99 of 1..100 is 99). 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    # fraction * n in floating point can land just above a whole number (0.07 * 100 is
    # 7.000000000000001), which ceil would take one rank too high.
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[min(len(ordered), max(1, rank)) - 1]


class CpuMeter:
    """CPU time spent by the whole machine and by the broker process, read from /proc: on a
    2-core machine the broker competes for CPU with the client being measured."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[float, float | None]:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        broker = None
        if self.broker_pid is not None:
            with open(f"/proc/{self.broker_pid}/stat") as stat:
                own = stat.read().rsplit(")", 1)[1].split()
            broker = (int(own[11]) + int(own[12])) / self.tick  # utime + stime
        return busy / self.tick, broker


def settle(meter: CpuMeter, idle_share: float = 0.05, limit_s: float = 120.0) -> float:
    """Wait until the broker is idle. After any write - a fill, one committed offset, one
    produced record - noida-db rewrites everything it holds, at most once a second: about 2 s of
    a core and 440 MB written per million records held, more as the run's topics accumulate. A
    timed run must not be charged with the rewrite the previous one set off. Returns the seconds
    waited (none for a broker not started here)."""
    started = time.monotonic()
    _, last = meter.read()
    while last is not None and time.monotonic() - started < limit_s:
        time.sleep(1.0)
        _, now = meter.read()
        if now is not None and now - last < idle_share:
            break
        last = now
    return time.monotonic() - started
