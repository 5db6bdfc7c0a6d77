"""CPU threads that fit the cores other processes leave free, re-checked while a model runs.

torch starts one intra-op thread per core and keeps them spinning between operations. On a
machine shared with other busy processes that collapses a decode loop (hundreds of small
operations per token): the threads wait on each other while the scheduler hands their cores
to someone else, and a 2-core machine with one other busy process was measured at 13x the CPU
time per token of a single thread. ``CoreShare`` watches how much CPU time the rest of the
machine uses on this process's cores (``/proc/stat`` minus this process's own time) and sets
torch's thread count to the cores left over, at most once per ``interval`` seconds.

The command line turns it on for its process (``enable()``); a library caller opts in the same
way or with ``TOOLKIT_SHARE_CORES=1``, since torch's thread count is process-wide state. It
steps aside when the user chose a count (``TOOLKIT_THREADS``, ``OMP_NUM_THREADS``, or a call
to ``torch.set_num_threads`` it did not make), and off Linux, where ``/proc/stat`` is missing.
"""
from __future__ import annotations

import os
import time

_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


_enabled = os.environ.get("TOOLKIT_SHARE_CORES") == "1"


def enable(on: bool = True) -> None:
    """Let model loops in this process fit torch's threads to the free cores (``CoreShare``)."""
    global _enabled
    _enabled = on


def is_enabled() -> bool:
    return _enabled


def available_cores() -> list[int]:
    """The CPU ids this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def busy_seconds(cpus: list[int]) -> float | None:
    """CPU seconds spent busy (not idle or waiting on I/O) on ``cpus`` since boot; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    wanted, total = {f"cpu{cpu}" for cpu in cpus}, 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks) - ticks[3] - ticks[4]
    return total / _USER_HZ


def user_thread_choice() -> int | None:
    """A thread count the user set in the environment, if any."""
    for name in ("TOOLKIT_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


class CoreShare:
    """Keeps ``torch.get_num_threads()`` at the number of cores others leave free (see module doc)."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.cores = available_cores()
        # /proc/stat is read only when fitting is on (off for library callers who did not opt in)
        self.enabled = _enabled and user_thread_choice() is None and busy_seconds(self.cores) is not None
        self._set_by_us: int | None = None
        self._mark = self._sample() if self.enabled else (0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, float, float]:
        return time.monotonic(), busy_seconds(self.cores) or 0.0, time.process_time()

    def free_cores(self, min_seconds: float | None = None) -> float | None:
        """Cores not used by other processes since the last sample; None until ``min_seconds``
        (default: ``interval``) have passed."""
        now = self._sample()
        wall = now[0] - self._mark[0]
        if wall < (self.interval if min_seconds is None else min_seconds) or wall <= 0:
            return None
        others = max(0.0, (now[1] - self._mark[1]) - (now[2] - self._mark[2])) / wall
        self._mark = now
        return len(self.cores) - min(others, len(self.cores))

    def adjust(self, min_seconds: float | None = None) -> None:
        """Re-fit torch's threads once ``min_seconds`` (default ``interval``) passed since the last
        fit; a count set by someone else stops us."""
        if not self.enabled:
            return
        import torch  # noqa: PLC0415 - enable() runs in every command; torch only where a model loops

        if self._set_by_us is not None and torch.get_num_threads() != self._set_by_us:
            self.enabled = False  # the caller changed it: theirs to manage from now on
            return
        free = self.free_cores(min_seconds)
        if free is None:
            return
        threads = max(1, min(len(self.cores), int(free + 0.25)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        self._set_by_us = threads

    def settle(self, seconds: float = 0.1) -> None:
        """Measure over ``seconds`` now and fit the threads (before a loop starts)."""
        if self.enabled:
            time.sleep(seconds)
            self.adjust(min_seconds=0.0)
