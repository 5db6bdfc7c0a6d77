"""Deferred: a registration whose object is imported when a load first asks for it.

Why: a process's first ``toolkit.load`` builds the registry from every installed plugin. A plugin
that registers its architecture object must import the module defining it, and with it that
model's layers (Gemma 3's, the Gated DeltaNet hybrids', the MoE blocks...), although a load uses
one architecture. A plugin may instead register ``Deferred("package.module:ATTRIBUTE", name=...,
aliases=...)``: the registry reads the keyword attributes (what it indexes by: an architecture's
``name`` and ``aliases``, a name map's ``format`` and ``architecture``) and imports the module when
a lookup returns the entry (``Registry.architecture``, ``Registry.name_map``).

``resolve`` checks that the imported object has the attributes it was registered under, so a
registration that drifts from its object fails on first use with a PluginError naming both, not
with a model built by the wrong code.
"""
from __future__ import annotations

import importlib
import threading
from typing import Any

from .errors import PluginError


class Deferred:
    """``target``'s object (``"module:attribute"``), imported by ``resolve``; ``known`` are the
    attributes the registry reads before that (set on this entry too)."""

    def __init__(self, target: str, **known: Any):
        self._module, _, self._attribute = target.partition(":")
        if not self._module or not self._attribute:
            raise PluginError(f"a deferred registration needs 'module:attribute', got {target!r}")
        self.target, self.known = target, known
        for key, value in known.items():
            setattr(self, key, value)
        self._object: Any = None
        self._lock = threading.Lock()

    def resolve(self) -> Any:
        """The object, imported on the first call; PluginError when the import fails, the attribute is
        missing, or the object disagrees with the attributes it was registered under."""
        with self._lock:
            if self._object is None:
                self._object = self._import()
        return self._object

    def _import(self) -> Any:
        try:
            found = getattr(importlib.import_module(self._module), self._attribute)
        except (ImportError, AttributeError) as exc:
            raise PluginError(f"deferred registration {self.target}: {type(exc).__name__}: {exc}") from exc
        for key, value in self.known.items():
            actual = getattr(found, key, None)
            if actual != value:
                raise PluginError(f"deferred registration {self.target} says {key}={value!r}, "
                                  f"the object has {actual!r}")
        return found

    def __repr__(self) -> str:
        return f"Deferred({self.target!r})"


def resolved(entry: Any) -> Any:
    """``entry``'s object if it is a Deferred registration, else ``entry`` itself."""
    return entry.resolve() if isinstance(entry, Deferred) else entry
