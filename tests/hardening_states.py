"""Stored states and pre-quantized checkpoints for the hardening tests, saved from a tiny HF model."""
from __future__ import annotations

from pathlib import Path

import toolkit
from toolkit.core.registry import default_registry


def sharded_state(hf_dir: Path, tmp_path: Path, loader: str = "sharded") -> Path:
    """``hf_dir`` loaded and saved by the ``sharded`` (or ``tensorizer``) loader under ``tmp_path``."""
    dest = tmp_path / f"{loader}-state"
    default_registry().loader(loader).save(toolkit.load(str(hf_dir), device="cpu"), dest)
    return dest


def bnb_checkpoint(hf_dir: Path, tmp_path: Path) -> Path:
    """``hf_dir`` quantized to NF4 and saved in transformers' pre-quantized layout."""
    dest = tmp_path / "bnb"
    default_registry().loader("bnb").save(toolkit.load(str(hf_dir), quant="bnb-nf4", device="cpu"), dest)
    return dest
