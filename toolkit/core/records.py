"""Value classes of the load path, without ``@dataclass``'s class-creation cost.

``@dataclass`` writes the source of ``__init__``, ``__repr__``, ``__eq__`` (and a frozen class's
``__setattr__``/``__delattr__``/``__hash__``) and ``exec``s it when the class is defined: ~0.5-1 ms per
class on CPython 3.11-3.13, and a fresh process's load defined ~20 such classes in the modules it
imports. The classes that took these bases instead write their own ``__init__`` (same parameters, order
and defaults as their dataclass form) and list their fields as class annotations, as a dataclass does;
the bases add what the dataclass form gave them, from those annotations:

- ``__repr__``: ``Name(field=value, ...)``, every field in order;
- ``__eq__``: equal when of the same class and every field is equal (``__hash__`` None, so unhashable),
  as ``@dataclass``; ``FrozenRecord`` adds a field-tuple ``__hash__`` and refuses assignment and deletion
  with ``dataclasses.FrozenInstanceError``, as ``@dataclass(frozen=True)``.

They are not dataclasses: ``dataclasses.replace``/``fields``/``asdict`` do not take them, so a class whose
users call those stays a dataclass (ModelConfig, LoadConfig, LoadedModel). No ``__slots__``: a frozen class
with slots needs its own pickling (``__setstate__``), and instances keep a ``__dict__`` as before.
"""
from __future__ import annotations

import reprlib
from dataclasses import FrozenInstanceError


class Record:
    """Field-wise ``__repr__`` and ``__eq__`` over the fields annotated in the class body (a subclass's
    fields follow its base's, as a dataclass's do)."""

    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = tuple(name for name in cls.__annotations__ if name not in cls._fields)  # this class's own (3.10+)
        cls._fields = cls._fields + own

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{self.__class__.__qualname__}({shown})"

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    __hash__ = None  # mutable and compared by value: unhashable, as a non-frozen dataclass


class FrozenRecord(Record):
    """A Record whose fields are set once, in ``__init__``, and hashable. The ``__init__`` fills
    ``self.__dict__`` directly (``self.__dict__.update(a=a, b=b)``): its ``__setattr__`` refuses."""

    def __setattr__(self, name: str, value) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __hash__(self) -> int:
        return hash(self._values())
