"""Detects and opens Hugging Face checkpoint directories."""
from __future__ import annotations

from pathlib import Path

from toolkit.core.checkpoint import Source
from toolkit.core.errors import SourceError

from .files import has_weights

# The reader (safetensors) and the writer are imported by open() / writer(): detect() runs on
# every load of every format, and importing them is most of this plugin's import time.


class SafetensorsLoader:
    name = "safetensors"

    def detect(self, source: Source) -> float | None:
        folder = source.path if source.is_dir else source.path.parent
        if not (folder / "config.json").exists() or not has_weights(folder):
            return None
        return 0.5  # the generic reader; format-specific loaders of HF layouts may claim more

    def open(self, source: Source, load_config) -> "HFCheckpoint":
        from .checkpoint import HFCheckpoint  # noqa: PLC0415

        folder = source.path if source.is_dir else source.path.parent
        if not (folder / "config.json").exists():
            raise SourceError(f"{folder} has no config.json")
        return HFCheckpoint(Path(folder), override=load_config.config_override)

    def writer(self, dest: Path, options) -> "HFWriter":
        """Streaming writer for ``toolkit convert --to safetensors[:DTYPE]``."""
        from .writer import HFWriter  # noqa: PLC0415

        return HFWriter(dest, options.target_type)
