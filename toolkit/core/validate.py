"""Typed checks of values read from a checkpoint's config or metadata.

Every check takes the value, the ``key`` it was read under and the ``file`` it came from, and
either returns the value in its canonical Python type or raises InvalidConfigError naming both.
Loaders use them on their own metadata (with their own key names); ``config_checks`` uses them
on the Hugging Face vocabulary every loader produces. Nothing here knows a format.

``bool`` is never accepted where a number is expected (``sliding_window: true`` is a mistake,
not 1), and numbers are never accepted as strings.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable

from .errors import InvalidConfigError

# Far above any published model, far below what would exhaust memory building one layer.
MAX_SIZE = 1 << 24          # vocab rows, hidden/intermediate sizes
MAX_HEADS = 1 << 14
MAX_LAYERS = 10_000
MAX_POSITIONS = 1 << 31


def _fail(message: str, key: str, file: str | None) -> InvalidConfigError:
    return InvalidConfigError(message, file=file, key=key)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(value: Any, *, key: str, file: str | None, minimum: int = 1, maximum: int = MAX_SIZE) -> int:
    """An int in ``[minimum, maximum]``; integral floats (``4096.0``) are accepted as ints."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(f"expected an integer, found {type(value).__name__} {_show(value)}", key, file)
    if isinstance(value, numbers.Integral):
        number = int(value)
    elif math.isfinite(float(value)) and float(value).is_integer():
        number = int(value)
    else:
        raise _fail(f"expected an integer, found {_show(value)}", key, file)
    if not minimum <= number <= maximum:
        raise _fail(f"{number} is out of range [{minimum}, {maximum}]", key, file)
    return number


def real(value: Any, *, key: str, file: str | None, minimum: float = 0.0, maximum: float = math.inf,
         inclusive: bool = False) -> float:
    """A finite float above ``minimum`` (at or above it when ``inclusive``) and at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(f"expected a number, found {type(value).__name__} {_show(value)}", key, file)
    number = float(value)
    if not math.isfinite(number):
        raise _fail(f"expected a finite number, found {number}", key, file)
    low_ok = number >= minimum if inclusive else number > minimum
    if not low_ok or number > maximum:
        bound = f"[{minimum}" if inclusive else f"({minimum}"
        raise _fail(f"{number} is out of range {bound}, {maximum}]", key, file)
    return number


def text(value: Any, *, key: str, file: str | None, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(f"expected a string, found {type(value).__name__} {_show(value)}", key, file)
    if not value and not allow_empty:
        raise _fail("expected a non-empty string", key, file)
    return value


def flag(value: Any, *, key: str, file: str | None) -> bool:
    """A bool (numpy's included); strings such as ``"false"`` are refused rather than read as True."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise _fail(f"expected true or false, found {type(value).__name__} {_show(value)}", key, file)


def choice(value: Any, choices: Iterable[str], *, key: str, file: str | None) -> str:
    options = sorted(choices)
    if not isinstance(value, str) or value not in options:
        raise _fail(f"{_show(value)} is not one of {', '.join(options)}", key, file)
    return value


def mapping(value: Any, *, key: str, file: str | None) -> dict:
    if not isinstance(value, dict):
        raise _fail(f"expected an object (mapping), found {type(value).__name__} {_show(value)}", key, file)
    return value


def sequence(value: Any, *, key: str, file: str | None, max_items: int = MAX_SIZE) -> list:
    """A list or tuple (not a string or mapping) of at most ``max_items`` items."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)):
        raise _fail(f"expected a list, found {type(value).__name__} {_show(value)}", key, file)
    if len(value) > max_items:
        raise _fail(f"list of {len(value)} items, at most {max_items} expected", key, file)
    return list(value)


def integers(value: Any, *, key: str, file: str | None, minimum: int = 0, maximum: int = MAX_SIZE,
             allow_scalar: bool = True) -> tuple[int, ...]:
    """One int or a list of ints (``eos_token_id`` may be either), each in range."""
    if allow_scalar and not isinstance(value, (list, tuple)):
        return (integer(value, key=key, file=file, minimum=minimum, maximum=maximum),)
    items = sequence(value, key=key, file=file, max_items=1 << 16)
    return tuple(integer(item, key=f"{key}[{i}]", file=file, minimum=minimum, maximum=maximum)
                 for i, item in enumerate(items))


def texts(value: Any, *, key: str, file: str | None, max_items: int = 1 << 16) -> tuple[str, ...]:
    items = sequence(value, key=key, file=file, max_items=max_items)
    return tuple(text(item, key=f"{key}[{i}]", file=file) for i, item in enumerate(items))
