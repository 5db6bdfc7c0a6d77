"""Streaming ``.npz`` writer: each tensor goes straight into the zip as one ``.npy`` member."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch


class NpzWriter:
    """``begin`` / ``add_tensor`` / ``finish``, as ``toolkit convert`` drives writers."""

    def __init__(self, dest: Path):
        self.dest = dest
        self.archive: zipfile.ZipFile | None = None
        self.num_parameters = 0

    def begin(self, *, hf_config: dict, tokenizer, num_tensors: int) -> None:
        self.dest.mkdir(parents=True)
        (self.dest / "config.json").write_text(json.dumps(hf_config, indent=2))
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(self.dest)
        # ZIP64 lets members pass 4 GiB; stored, not deflated, so reads stay cheap.
        self.archive = zipfile.ZipFile(self.dest / "model.npz", "w", zipfile.ZIP_STORED, allowZip64=True)

    def add_tensor(self, hf_name: str, tensor: torch.Tensor) -> None:
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
            tensor = tensor.float()
        with self.archive.open(f"{hf_name}.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, tensor.detach().cpu().contiguous().numpy(), allow_pickle=False)
        self.num_parameters += tensor.numel()

    def finish(self) -> dict:
        self.archive.close()
        return {"parameters": self.num_parameters}
