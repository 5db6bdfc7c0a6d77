"""Detects and opens Hugging Face checkpoint directories."""
from __future__ import annotations

from pathlib import Path

from toolkit.core.checkpoint import Source
from toolkit.core.errors import SourceError

from .checkpoint import HFCheckpoint, has_weights
from .writer import HFWriter


class SafetensorsLoader:
    name = "safetensors"

    def detect(self, source: Source) -> float | None:
        folder = source.path if source.is_dir else source.path.parent
        if not (folder / "config.json").exists() or not has_weights(folder):
            return None
        return 0.5  # the generic reader; format-specific loaders of HF layouts may claim more

    def open(self, source: Source, load_config) -> HFCheckpoint:
        folder = source.path if source.is_dir else source.path.parent
        if not (folder / "config.json").exists():
            raise SourceError(f"{folder} has no config.json")
        return HFCheckpoint(Path(folder), override=load_config.config_override)

    def writer(self, dest: Path, options) -> HFWriter:
        """Streaming writer for ``toolkit convert --to safetensors[:DTYPE]``."""
        return HFWriter(dest, options.target_type)
