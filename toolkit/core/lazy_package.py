"""A third-party package imported without running its ``__init__`` until a name needs it.

Some packages' ``__init__`` star-imports every submodule, including ones that import further
packages a caller never uses. ``defer_package_init(name, quick=...)`` makes the next
``import name`` create the package module without running its ``__init__``. The module then answers
a missing attribute (PEP 562 ``__getattr__``), in this order:

1. a submodule of that name (``from name import submodule``), imported as usual;
2. a name of ``quick`` (the names the caller uses, each with the submodule defining it), imported
   from that submodule;
3. anything else (a writer class, ``__all__`` for ``import *``, ...): the real ``__init__`` runs
   once, in the module, and the attribute is looked up again.

Step 2 must give the very object step 3 would (the ``__init__`` star-imports those submodules); the
caller that lists ``quick`` keeps a test saying so for the installed version. Nothing is done when
the package is already imported or cannot be found.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading


def defer_package_init(name: str, *, quick: dict[str, str]) -> None:
    """Have the next ``import name`` defer the package's ``__init__`` (see the module docstring)."""
    if name not in sys.modules and not any(isinstance(f, _DeferredInit) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredInit(name, quick))


class _DeferredInit:
    """A one-shot ``sys.meta_path`` finder for one top-level package."""

    def __init__(self, name: str, quick: dict[str, str]):
        self.name, self.quick = name, quick

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the finders after this one
        if spec is None or spec.loader is None or not spec.submodule_search_locations \
                or not hasattr(spec.loader, "exec_module"):
            return spec  # not a package with a loader we can defer: imported as usual
        spec.loader = _DeferredLoader(spec.loader, self.quick)
        return spec


class _DeferredLoader:
    def __init__(self, loader, quick: dict[str, str]):
        self.loader, self.quick = loader, quick

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        real, quick, lock, done = self.loader, self.quick, threading.RLock(), []
        module.__loader__ = real  # the package's own loader again (importlib.resources, reloads)
        if module.__spec__ is not None:
            module.__spec__.loader = real

        def __getattr__(attr: str):
            with lock:
                if not done and attr in quick:
                    value = getattr(importlib.import_module(f"{module.__name__}.{quick[attr]}"), attr)
                    setattr(module, attr, value)
                    return value
                if not done and not attr.startswith("_") \
                        and importlib.util.find_spec(f"{module.__name__}.{attr}") is not None:
                    return importlib.import_module(f"{module.__name__}.{attr}")
                if not done:
                    done.append(True)
                    del module.__dict__["__getattr__"]
                    real.exec_module(module)  # the real __init__, once
            try:
                return module.__dict__[attr]
            except KeyError:
                raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

        module.__getattr__ = __getattr__

    def __getattr__(self, attr):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, attr)
