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


class _PassiveImport:
    """A ``sys.meta_path`` finder that wraps one top-level module's first import in
    ``passive_waiting`` and then removes itself (see ``wait_passively_when_imported``)."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util  # noqa: PLC0415

        self.remove()
        spec = importlib.util.find_spec(fullname)  # the finders after this one (it is gone now)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PassiveLoader(spec.loader)
        return spec

    def remove(self) -> None:
        import sys  # noqa: PLC0415

        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _PassiveLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # the real loader is the module's loader again, inside the import already (torch's own
        # imports may look at torch.__spec__) and for good afterwards
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        with passive_waiting():
            self.loader.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


def wait_passively_when_imported(name: str = "torch") -> None:
    """Whenever this process first imports ``name`` (torch), its OpenMP runtime waits passively.

    Why: ``import toolkit`` no longer imports torch itself (a ``toolkit convert`` that re-quantizes a
    file needs none, and torch's import is most of that command's time), but torch's
    OpenMP runtime must still see the policy when it loads, whoever imports it first."""
    import sys  # noqa: PLC0415

    if name not in sys.modules and not any(isinstance(f, _PassiveImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PassiveImport(name))
