"""Module attributes imported on first use (PEP 562 ``__getattr__``), so that importing a package
(``toolkit``, a plugin that only registers) does not import what only some callers need."""
from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_attributes(module: str, table: dict[str, str]) -> Callable[[str], object]:
    """A ``__getattr__`` for ``module``: ``name`` in ``table`` is imported from ``table[name]`` (a
    module name, relative to ``module`` when it starts with a dot) on first access and kept on the
    module, so later accesses are plain attribute reads."""
    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name], module), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
