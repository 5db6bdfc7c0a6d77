"""A loaded checkpoint closed and dropped on a background thread.

Why: dropping a checkpoint unmaps its files, and unmapping a map that a load read through tears
down one page-table entry per 4 KiB page it touched: 25-32 ms for a 0.9 GB model file on the
2-core dev box (``.dev/s29/gil_unmap.py``), in proportion for larger files, and all of it on the
load's critical path, after the last weight is placed. ``munmap`` runs without the GIL, so on its
own thread it overlaps whatever the caller does next (the same box: a Python loop on the main thread
kept its pace while the map went).

The thread holds the only reference: the caller hands the checkpoint over in a list and keeps
none, so the last reference, and the unmapping, is dropped there. A failing ``close`` is reported
as a warning from that thread; the model is loaded by then and owns copies of its weights.
``TOOLKIT_BACKGROUND_RELEASE=0`` closes and drops on the caller's thread, as before.
"""
from __future__ import annotations

import os
import threading
import warnings


_started: list[threading.Thread] = []  # release threads that may still run (what ``wait`` joins)


def release(handed_over: list) -> None:
    """Close each checkpoint in ``handed_over`` and drop it, on a daemon thread, or here when
    background release is off. The caller must hold no other reference to them."""
    if os.environ.get("TOOLKIT_BACKGROUND_RELEASE") == "0":
        _close_all(handed_over)
        return
    _started[:] = [thread for thread in _started if thread.is_alive()]
    thread = threading.Thread(target=_close_all, args=(handed_over,), name="toolkit-release", daemon=True)
    _started.append(thread)
    thread.start()


def wait() -> None:
    """Return once every checkpoint handed to ``release`` so far is closed and dropped (for a caller
    that deletes or rewrites the files next on a system that refuses it while they are mapped, and
    for tests)."""
    while _started:
        _started.pop().join()


def _close_all(handed_over: list) -> None:
    while handed_over:
        checkpoint = handed_over.pop()
        try:
            checkpoint.close()
        except Exception as exc:  # noqa: BLE001 - the load has finished; a close failure loses nothing
            warnings.warn(f"could not close the {type(checkpoint).__name__} after the load: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=1)
        del checkpoint  # the last reference: its maps are unmapped here
