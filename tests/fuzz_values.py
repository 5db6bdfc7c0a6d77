"""Building blocks of the fuzzer's mutations: absurd values, JSON edits, byte edits.

Every function takes a ``random.Random`` so a case is reproduced exactly from its (seed, id).
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

NUMBERS: list[Any] = [0, -1, -3, 1, 2, 3, 7, 2**20, 10**6, 10**9, 10**12, 2**31 - 1, 2**32, 2**63 - 1, -2**63,
                      0.5, -0.0, 1e-30, 1e30, math.nan, math.inf, -math.inf]
OTHERS: list[Any] = ["", "x", "silu ", "gelu", "float99", "/etc/passwd", "../x", "\u65e5\u672c", True, False, None,
                     [], [1], [1, 2, 3], [[1]], ["a"], {}, {"a": 1}, {"rope_type": "yarn"}, {"rope_type": "linear"},
                     {"type": "linear", "factor": "x"}, {"rope_type": "llama3", "factor": 8.0}]


def absurd(rng: random.Random) -> Any:
    """A value that is well-formed JSON but absurd for almost any config key."""
    pool = NUMBERS if rng.random() < 0.6 else OTHERS
    return rng.choice(pool)


def dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


# ---- JSON ------------------------------------------------------------------------------------------
def paths(value: Any, prefix: tuple = (), depth: int = 0, limit: int = 400) -> list[tuple]:
    """Key paths into nested dicts/lists (lists sampled at a few indices), breadth-limited."""
    found: list[tuple] = []
    if depth > 6:
        return found
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        indices = sorted({0, len(value) - 1, len(value) // 2}) if value else []
        children = [(i, value[i]) for i in indices]
    else:
        return found
    for key, child in children:
        found.append(prefix + (key,))
        if len(found) < limit:
            found.extend(paths(child, prefix + (key,), depth + 1, limit - len(found)))
    return found


def _parent(root: Any, path: tuple) -> Any:
    node = root
    for key in path[:-1]:
        node = node[key]
    return node


def edit_json(root: Any, rng: random.Random, focus: list[tuple] | None = None) -> str:
    """Replace, delete or add one value in ``root`` (in place); returns what was done.

    :param focus: paths to prefer (half of the time), e.g. a config's hyperparameters; a focus
        path absent from ``root`` is added
    """
    if focus and rng.random() < 0.5:
        path = rng.choice(focus)
        try:
            parent = _parent(root, path)
        except (KeyError, IndexError, TypeError):
            return "focus path unreachable (unchanged)"
        if isinstance(parent, dict) and rng.random() < 0.15:
            parent.pop(path[-1], None)
            return f"delete {path}"
        if isinstance(parent, (dict, list)):
            if isinstance(parent, list) and not (isinstance(path[-1], int) and path[-1] < len(parent)):
                return "focus index out of range (unchanged)"
            value = absurd(rng)
            parent[path[-1]] = value
            return f"set {path} = {dumps(value)[:60]}"
    candidates = paths(root)
    if not candidates:
        return "nothing to edit"
    path = rng.choice(candidates)
    parent = _parent(root, path)
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"delete {path}"
    if roll < 0.22 and isinstance(parent, list):
        del parent[path[-1]]
        return f"delete item {path}"
    value = absurd(rng)
    parent[path[-1]] = value
    return f"set {path} = {dumps(value)[:60]}"


def edit_json_file(path: Path, rng: random.Random, focus: list[tuple] | None = None) -> str:
    root = json.loads(path.read_text())
    done = edit_json(root, rng, focus)
    path.write_text(dumps(root))
    return f"{path.name}: {done}"


def break_json_file(path: Path, rng: random.Random) -> str:
    """Whole-file damage: not UTF-8, not an object, truncated, empty, deeply nested."""
    choice = rng.randrange(6)
    data = path.read_bytes()
    if choice == 0:
        cut = rng.randrange(len(data)) if data else 0
        path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:])
        return f"{path.name}: invalid UTF-8 at {cut}"
    if choice == 1:
        path.write_text(rng.choice(["[1, 2]", '"config"', "42", "null", "true"]))
        return f"{path.name}: not an object"
    if choice == 2:
        cut = rng.randrange(len(data)) if data else 0
        path.write_bytes(data[:cut])
        return f"{path.name}: truncated at {cut}"
    if choice == 3:
        path.write_bytes(b"")
        return f"{path.name}: empty"
    if choice == 4:
        path.write_text("[" * 100_000 + "]" * 100_000)
        return f"{path.name}: nested 100000 deep"
    return f"{path.name}: " + flip_bytes(path, rng)


# ---- bytes -----------------------------------------------------------------------------------------
def flip_bytes(path: Path, rng: random.Random, start: int = 0, end: int | None = None) -> str:
    data = bytearray(path.read_bytes())
    if not data:
        return "empty file (unchanged)"
    end = len(data) if end is None else min(end, len(data))
    start = min(start, end - 1)
    spots = [rng.randrange(start, end) for _ in range(rng.randint(1, 4))]
    for spot in spots:
        data[spot] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"flipped bits at {spots}"


def damage_bytes(path: Path, rng: random.Random) -> str:
    """Flip bits, truncate, zero a range, or overwrite a range with 0xFF."""
    data = path.read_bytes()
    choice = rng.randrange(4)
    if choice == 0 or not data:
        return f"{path.name}: " + flip_bytes(path, rng)
    cut = rng.randrange(len(data))
    if choice == 1:
        path.write_bytes(data[:cut])
        return f"{path.name}: truncated at {cut}"
    width = rng.choice([1, 4, 8, 64, 512])
    fill = b"\x00" if choice == 2 else b"\xff"
    path.write_bytes(data[:cut] + fill * min(width, len(data) - cut) + data[cut + width:])
    return f"{path.name}: {width} bytes of {fill!r} at {cut}"
