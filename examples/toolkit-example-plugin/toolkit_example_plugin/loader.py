"""The ``npz`` loader: detects a directory (or file) with ``config.json`` beside ``*.npz``."""
from __future__ import annotations

from pathlib import Path

from toolkit.core.checkpoint import Source
from toolkit.core.errors import SourceError

from .checkpoint import NpzCheckpoint
from .writer import NpzWriter


def _folder(source: Source) -> Path:
    return source.path if source.is_dir else source.path.parent


class NpzLoader:
    name = "npz"

    def detect(self, source: Source) -> float | None:
        folder = _folder(source)
        # A file is ours only if it is an archive; a directory, if it holds one.
        has_archive = source.path.suffix == ".npz" if not source.is_dir else any(folder.glob("*.npz"))
        return 0.9 if has_archive and (folder / "config.json").exists() else None

    def open(self, source: Source, load_config) -> NpzCheckpoint:
        folder = _folder(source)
        archives = [source.path] if source.path.suffix == ".npz" else sorted(folder.glob("*.npz"))
        if not archives:
            raise SourceError(f"{folder} has no .npz archive")
        return NpzCheckpoint(folder, archives, config_override=getattr(load_config, "config_override", None))

    def writer(self, dest: Path, options) -> NpzWriter:
        """Streaming writer for ``toolkit convert --to npz`` (one tensor at a time)."""
        return NpzWriter(Path(dest))
