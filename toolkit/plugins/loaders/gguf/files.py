"""Which files make up one GGUF model: a single file, or the parts of a split model.

Split models are written by llama.cpp's ``gguf-split`` as ``name-00001-of-00003.gguf`` ...;
every part is found from any one of them (usually the first), and each part's
``split.count`` metadata must agree with the names.
"""
from __future__ import annotations

import re
from pathlib import Path

from toolkit.core.errors import SourceError

from .reader import has_magic

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """Every part of the model ``path`` belongs to, in order (just ``[path]`` if it is not split)."""
    match = _SPLIT.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    parts = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise SourceError(f"split GGUF model {parts[0].name} has {count} parts but {', '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}")
    return parts


def models_in(folder: Path, hint: str | None = None) -> list[list[Path]]:
    """The GGUF models in a directory (each a list of parts); ``hint`` keeps names containing it."""
    candidates = sorted(p for p in folder.glob("*.gguf") if p.is_file() and has_magic(p))
    if hint:
        candidates = [p for p in candidates if hint.lower() in p.name.lower()]
    models: dict[str, list[Path]] = {}
    for path in candidates:
        match = _SPLIT.match(path.name)
        key = f"{match['stem']}-of-{match['count']}" if match else path.name
        models.setdefault(key, []).append(path)
    return [split_parts(sorted(paths)[0]) if _SPLIT.match(paths[0].name) else paths for paths in models.values()]


def model_files(path: Path, hint: str | None = None) -> list[Path]:
    """The parts of the one GGUF model at ``path`` (a file or a directory); SourceError otherwise."""
    if path.is_file():
        return split_parts(path)
    models = models_in(path, hint)
    if not models:
        raise SourceError(f"{path} holds no GGUF file")
    if len(models) > 1:
        names = ", ".join(parts[0].name for parts in models)
        raise SourceError(f"{path} holds {len(models)} GGUF models ({names}); pass the file you mean")
    return models[0]
