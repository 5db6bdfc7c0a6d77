"""Where the GGUF loader keeps what is costly to work out again (built tokenizers, string indexes).

``$TOOLKIT_TOKENIZER_CACHE`` if set (empty, ``0``, ``off`` or ``none`` turns caching off), else
``$XDG_CACHE_HOME/toolkit/tokenizers`` (``~/.cache/toolkit/tokenizers``). Kept apart from
``tokenizer_cache.py`` so that the reader can use it without importing ``tokenizers``.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "TOOLKIT_TOKENIZER_CACHE"


def cache_dir() -> Path | None:
    """Where built tokenizers are kept, or None when caching is off."""
    override = os.environ.get(ENV)
    if override is not None:
        return None if override.strip().lower() in ("", "0", "off", "none") else Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "toolkit" / "tokenizers"
