"""The ``tensorizer`` loader: detects a tensorizer stored-state directory, opens its rank, saves."""
from __future__ import annotations

from typing import Any

from toolkit.core.checkpoint import Source
from toolkit.plugins.loaders.sharded.loader import save_everywhere, state_folder
from toolkit.plugins.loaders.sharded.manifest_find import find

from .crypt import Key, key_from_environment, verify_from_environment
from .tags import MANIFEST, TAG

# The reader and the writer (and the manifest's checks, stored.py) are imported by open() / save(),
# not at registration: detect() runs on every load of every format.


class TensorizerLoader:
    """:param key: decryption key (default: from the environment, see crypt.py)
    :param verify_hash: check tensorizer's per-tensor hashes (default: TOOLKIT_TENSORIZER_VERIFY_HASH)"""

    name = "tensorizer"

    def __init__(self, *, key: Key | None = None, verify_hash: bool | None = None):
        self.key, self.verify_hash = key, verify_hash

    def detect(self, source: Source) -> float | None:
        return 1.0 if find(state_folder(source), MANIFEST, TAG) else None

    def open(self, source: Source, load_config) -> "TensorizerCheckpoint":
        from .checkpoint import TensorizerCheckpoint  # noqa: PLC0415

        key = self.key if self.key is not None else key_from_environment()
        verify = self.verify_hash if self.verify_hash is not None else verify_from_environment()
        return TensorizerCheckpoint(state_folder(source), tp_rank=load_config.tp_rank, tp_size=load_config.tp_size,
                                    device=load_config.device, key=key, verify_hash=verify)

    def save(self, loaded_model, dest, options=None) -> dict[str, Any]:
        """Serialize each rank's parameters as stored; options: TensorizerSaveOptions or a mapping."""
        from toolkit.plugins.loaders.sharded.options import resolve_options  # noqa: PLC0415

        from .writer import TensorizerSaveOptions, save_rank  # noqa: PLC0415

        return save_everywhere(save_rank, loaded_model, dest, resolve_options(TensorizerSaveOptions, options))

    def quant_for_target(self, kind: str | None) -> str | None:
        """``--to tensorizer:SPEC`` quantizes on the fly with SPEC before saving."""
        return kind
