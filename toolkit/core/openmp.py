"""OpenMP's wait policy for the runtimes toolkit loads, kept out of child processes.

OpenMP's default policy spins idle worker threads between parallel regions. On a small machine
where another process holds a core, a spinning worker and the thread that needs that core take
turns by scheduler timeslices: on the 2-core dev machine with one core busy, a tiny ``torch.bmm``
went from 34 us (1 thread) to 5.5-14 ms (2 threads), and Gemma 3 270M decode from ~70 to ~700 ms
per token. Passive waiting costs a futex wake per region instead (73 ms per token at 2 threads in
the same conditions).

An OpenMP runtime reads ``OMP_WAIT_POLICY`` once, when it is loaded, so the policy is only set
around the moments toolkit loads one (torch's import, a compiled kernel module) and removed
again afterwards: left in the environment it would reach child processes, and llama.cpp (itself
an OpenMP program) decoded at 22 instead of 50 tok/s when started from a process that had
imported toolkit. A policy the user set is never touched. Imports no torch (it runs before).
"""
from __future__ import annotations

import contextlib
import os

POLICY = "PASSIVE"


@contextlib.contextmanager
def passive_waiting():
    """OpenMP runtimes initialized inside this block wait passively (unless the user chose a policy)."""
    added = "OMP_WAIT_POLICY" not in os.environ
    if added:
        os.environ["OMP_WAIT_POLICY"] = POLICY
    try:
        yield
    finally:
        if added:
            os.environ.pop("OMP_WAIT_POLICY", None)
