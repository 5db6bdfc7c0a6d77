"""CoreShare: torch's CPU threads follow the cores that other processes leave free.

The machine's counters are replaced by a scripted clock (wall seconds, busy CPU seconds on our
cores, this process's CPU seconds), so each case states exactly how busy the others were.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.core import threads


class Clock:
    def __init__(self):
        self.wall = self.busy = self.own = 0.0

    def advance(self, wall: float, others_busy: float, own_busy: float) -> None:
        """``wall`` seconds pass; others use ``others_busy`` cores and we ``own_busy`` cores on average."""
        self.wall += wall
        self.busy += wall * (others_busy + own_busy)
        self.own += wall * own_busy


@pytest.fixture
def share(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(threads, "available_cores", lambda: [0, 1])
    monkeypatch.setattr(threads, "busy_seconds", lambda cpus: clock.busy)
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock.wall)
    monkeypatch.setattr(threads.time, "process_time", lambda: clock.own)
    for name in ("TOOLKIT_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_enabled", True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield clock
    torch.set_num_threads(before)


def test_one_busy_neighbour_leaves_one_thread(share):
    cores = threads.CoreShare(interval=1.0)
    share.advance(1.0, others_busy=1.0, own_busy=1.0)
    cores.adjust()
    assert torch.get_num_threads() == 1


def test_idle_machine_keeps_every_core_and_recovers(share):
    cores = threads.CoreShare(interval=1.0)
    share.advance(1.0, others_busy=2.0, own_busy=0.0)  # others saturate both cores
    cores.adjust()
    assert torch.get_num_threads() == 1
    share.advance(1.0, others_busy=0.05, own_busy=1.0)  # they stopped
    cores.adjust()
    assert torch.get_num_threads() == 2


def test_checks_at_most_once_per_interval(share):
    cores = threads.CoreShare(interval=1.0)
    share.advance(0.5, others_busy=2.0, own_busy=0.0)
    cores.adjust()
    assert torch.get_num_threads() == 2  # not enough time measured yet


def test_a_count_the_user_set_is_left_alone(share, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cores = threads.CoreShare(interval=1.0)
    share.advance(1.0, others_busy=2.0, own_busy=0.0)
    cores.adjust()
    assert torch.get_num_threads() == 2


def test_stops_once_someone_else_changes_the_count(share):
    cores = threads.CoreShare(interval=1.0)
    share.advance(1.0, others_busy=1.0, own_busy=1.0)
    cores.adjust()
    torch.set_num_threads(2)  # the caller takes over
    share.advance(1.0, others_busy=1.0, own_busy=1.0)
    cores.adjust()
    assert torch.get_num_threads() == 2 and not cores.enabled


def test_off_unless_enabled(share, monkeypatch):
    monkeypatch.setattr(threads, "_enabled", False)
    cores = threads.CoreShare(interval=1.0)
    share.advance(1.0, others_busy=2.0, own_busy=0.0)
    cores.adjust()
    assert torch.get_num_threads() == 2


def test_reads_this_machine():
    cpus = threads.available_cores()
    assert cpus and (threads.busy_seconds(cpus) is None or threads.busy_seconds(cpus) > 0)


def test_settle_measures_now_instead_of_waiting_an_interval(share, monkeypatch):
    cores = threads.CoreShare(interval=1.0)
    monkeypatch.setattr(threads.time, "sleep", lambda seconds: share.advance(seconds, others_busy=1.0, own_busy=0.0))
    cores.settle(0.1)
    assert torch.get_num_threads() == 1


def test_disabled_share_never_reads_the_machine(monkeypatch):
    monkeypatch.setattr(threads, "_enabled", False)
    monkeypatch.setattr(threads, "busy_seconds", lambda cpus: pytest.fail("read /proc/stat while disabled"))
    threads.CoreShare().adjust()
