"""Save options of the stored-state writers, read from what a caller passes as ``options``.

``save(loaded_model, dest, options)`` accepts None, the writer's own options dataclass, a
mapping of its field names, or the conversion driver's ``ConvertOptions`` (whose ``extra``
strings are parsed into the fields). Unknown keys are an error, never silently ignored.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from toolkit.core.errors import ConversionError

T = TypeVar("T")
_UNITS = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30, "b": 1}


def resolve_options(cls: type[T], options: Any) -> T:
    """``options`` as a ``cls`` instance (see the module docstring)."""
    if options is None:
        return cls()
    if isinstance(options, cls):
        return options
    if isinstance(options, Mapping):
        return _from_mapping(cls, options)
    extra = getattr(options, "extra", None)
    if isinstance(extra, Mapping):  # the conversion driver's ConvertOptions
        return _from_mapping(cls, extra)
    raise ConversionError(f"save options must be None, a mapping or {cls.__name__}, not {type(options).__name__}")


def _from_mapping(cls: type[T], values: Mapping) -> T:
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConversionError(f"unknown save option(s) {', '.join(unknown)}; this writer takes {', '.join(fields)}")
    return cls(**{name: _coerce(name, value, fields[name].default) for name, value in values.items()})


def _coerce(name: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    if isinstance(default, bool):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return parse_size(value, name)
    return value


def parse_size(text: str, name: str = "size") -> int:
    """``"2GB"``, ``"500MiB"``, ``"1048576"`` -> bytes."""
    lowered = text.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if lowered.endswith(unit):
            number = lowered[: -len(unit)].strip()
            break
    else:
        unit, number = "b", lowered
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError:
        raise ConversionError(f"option {name}={text!r} is not a size such as 2GB or 500MiB") from None
