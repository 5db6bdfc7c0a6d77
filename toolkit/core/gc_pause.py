"""Python's cyclic garbage collector, paused while a load runs.

A process's first load imports ~170 modules (the plugins, the format's reader, the tokenizer
library) and creates hundreds of modules and parameters. Those allocations cross the collector's
thresholds, and a full collection then walks every tracked object of the process, torch's
included: one such pause was ~0.08 s of a ~0.55 s load of a 1.5B quantized model on the 2-core dev box
(``bench/bench_load_phases.py`` reports it). Nearly everything a load allocates lives on (modules,
code, the model), so that collection finds little to free; reference counting frees the rest
either way, paused or not.

The pause moves the collection out of the load, it does not cancel it: once the collector is on
again, the process's next full collection comes when it next allocates enough objects.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Turn the cyclic garbage collector off inside the block; afterwards, even when the block
    raises, it is on again only if it was on before (a caller that turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
