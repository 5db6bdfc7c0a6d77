"""Whether a folder holds a stored-state manifest of one kind: what ``detect`` asks on every load.

Apart from manifest.py, whose reading and writing import the manifest checks and stored.py (torch,
two dataclasses): the sharded and tensorizer loaders' ``detect`` runs on every load of every format,
and a load of another format must not import them.
"""
from __future__ import annotations

import json
from pathlib import Path


def find(folder: Path, name: str, tag: str) -> Path | None:
    """The manifest file if ``folder`` holds one of this kind (cheap; used by ``detect``)."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        return path if json.loads(path.read_text()).get("format") == tag else None
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
