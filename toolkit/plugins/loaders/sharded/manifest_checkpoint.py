"""What every per-rank stored-state checkpoint shares: its manifest, this rank's entry,
tokenizer and summary. Subclasses (safetensors parts, tensorizer files) only read tensors."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from toolkit.core.checkpoint import CheckpointSummary, TensorInfo
from toolkit.core.errors import CorruptFileError

from . import manifest
from .stored import load_tokenizer, parse_dtype


class ManifestCheckpoint:
    format = ""

    def __init__(self, folder: Path, *, manifest_name: str, tag: str, tp_rank: int, tp_size: int):
        self.folder, self.tp_rank, self.tp_size = folder, tp_rank, tp_size
        self.manifest_path = folder / manifest_name
        self.manifest = manifest.read(self.manifest_path, tag)
        self.config_file = str(self.manifest_path)
        self.hf_config: dict = self.manifest["hf_config"]
        self.quant_scheme: str | None = self.manifest["quant_scheme"]
        self.quant_metadata: Any = self.manifest.get("quant_metadata")
        self.params_dtype = _params_dtype(self.manifest, self.manifest_path)
        own = self.manifest["ranks"].get(str(tp_rank), {}).get("files", [])
        self.files = (self.manifest_path, *(folder / name for name in own))

    def _entry(self) -> dict[str, Any]:
        """This rank's entry; the tp size is checked here, when tensors are first asked for."""
        return manifest.rank_entry(self.manifest, tp_rank=self.tp_rank, tp_size=self.tp_size,
                                   path=self.manifest_path)

    def tensor_names(self) -> list[str]:
        return [record["name"] for record in self._entry()["tensors"]]

    def tokenizer(self):
        return load_tokenizer(self.folder, self.manifest.get("tokenizer_files") or [])

    def _record_nbytes(self, record: dict[str, Any]) -> int:
        """Bytes shown by ``summary`` for one tensor record (0 where the format does not tell)."""
        return 0

    def summary(self) -> CheckpointSummary:
        metadata = {key: value for key, value in self.manifest.items() if key not in ("ranks", "hf_config")}
        tensors = [TensorInfo(r["name"], tuple(r["shape"]), r["dtype"], self._record_nbytes(r), r["file"])
                   for rank in sorted(self.manifest["ranks"], key=int) for r in self.manifest["ranks"][rank]["tensors"]]
        return CheckpointSummary(format=self.format, architecture=self.manifest["architecture"],
                                 metadata=dict(metadata, **self.hf_config), tensors=tensors)

    def close(self) -> None:
        return None


def _params_dtype(manifest_data: dict, path: Path) -> torch.dtype:
    try:
        return parse_dtype(manifest_data["params_dtype"])
    except ValueError as exc:
        raise CorruptFileError(str(exc), file=str(path)) from exc
