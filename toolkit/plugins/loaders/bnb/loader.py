"""Detects and opens bitsandbytes checkpoints (config.json ``quantization_config.quant_method`` =
``bitsandbytes``) and saves toolkit models quantized with a bnb scheme in the same layout."""
from __future__ import annotations

import json
from pathlib import Path

from toolkit.core.checkpoint import Source
from toolkit.core.errors import SourceError
from toolkit.plugins.loaders.safetensors.files import has_weights

FORMAT = "bnb"  # the checkpoint's format: the key of its name map
# BnbCheckpoint (safetensors, the bnb scheme's tensors) is imported by open(), not at registration

CONFIDENCE = 0.9  # above the generic safetensors reader (0.5), which would not group the statistics


class BnbLoader:
    name = "bnb"

    def detect(self, source: Source) -> float | None:
        folder = _folder(source)
        if not has_weights(folder):
            return None
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError, RecursionError):  # open() reports a broken config precisely
            return None
        quant = config.get("quantization_config") if isinstance(config, dict) else None
        return CONFIDENCE if isinstance(quant, dict) and quant.get("quant_method") == "bitsandbytes" else None

    def open(self, source: Source, load_config) -> "BnbCheckpoint":
        from .checkpoint import BnbCheckpoint  # noqa: PLC0415

        folder = _folder(source)
        if not (folder / "config.json").exists():
            raise SourceError(f"{folder} has no config.json")
        return BnbCheckpoint(folder, override=load_config.config_override)

    def quant_for_target(self, target_type: str | None) -> str:
        """``toolkit convert --to bnb[:nf4|fp4|int8[:options]]`` loads the source with this scheme."""
        kind, _, options = (target_type or "nf4").partition(":")
        return f"bnb-{kind}:{options}" if options else f"bnb-{kind}"

    def save(self, loaded_model, dest, options=None) -> dict:
        """Write ``loaded_model`` (quantized by a bnb scheme, tp=1) as a transformers-loadable checkpoint."""
        from .save import save_pretrained  # noqa: PLC0415 - imports bitsandbytes, which registration must not

        return save_pretrained(loaded_model, Path(dest))


def _folder(source: Source) -> Path:
    return source.path if source.is_dir else source.path.parent
