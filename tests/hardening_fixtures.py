"""Small helpers shared by the tests/test_hardening_*.py files: tiny checkpoints written once per
session and copied per test, edits of their config/metadata, and the assertion every bad input
must pass (a ToolkitError subclass whose message names the file, and the key or tensor)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fuzz_gguf
import toolkit
from toolkit.core.errors import ToolkitError


def copy_of(source: Path, tmp_path: Path) -> Path:
    """A private copy of a session-scoped checkpoint (file or directory)."""
    target = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return target


def edit_config(folder: Path, **changes) -> Path:
    """Set (or, for the value ``...``, delete) keys of ``folder/config.json``; returns the file."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, allow_nan=True))
    return path


def edit_gguf(path: Path, edit) -> Path:
    """Rewrite a GGUF file after ``edit(model)`` changes its parsed parts (see fuzz_gguf.GGUFModel)."""
    model = fuzz_gguf.parse(path)
    edit(model)
    path.write_bytes(fuzz_gguf.serialize(model))
    return path


def set_kv(model: fuzz_gguf.GGUFModel, key: str, vtype, value, sub=None) -> None:
    existing = model.kv(key)
    if existing is None:
        model.kvs.append(fuzz_gguf.KV(key, vtype, value, sub))
    else:
        existing.vtype, existing.value, existing.sub = vtype, value, sub


def drop_kv(model: fuzz_gguf.GGUFModel, key: str) -> None:
    model.kvs = [kv for kv in model.kvs if kv.key != key]


def typed_failure(reference, *, names: str, error=ToolkitError, mentions: tuple[str, ...] = (), **load_args):
    """Load ``reference`` expecting ``error``; its message must name ``names`` (a file) and ``mentions``."""
    with pytest.raises(error) as info:
        toolkit.load(str(reference), device="cpu", **load_args)
    message = str(info.value)
    assert names in message, message
    for text in mentions:
        assert text in message, message
    return info.value
