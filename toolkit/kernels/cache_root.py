"""Where compiled kernels and what they key on are kept between processes.

``$TOOLKIT_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/toolkit/kernels`` (``~/.cache/toolkit/kernels``):
the CPU extensions (gguf_cpu/build.py), the plain quantizer library (gguf_quant/plain.py) and
Triton's remembered compiler key (triton_key_memo.py). Imports nothing heavy.
"""
from __future__ import annotations

import os
from pathlib import Path


def kernel_cache_root() -> Path:
    """The directory (not created here) under which each kind of kernel keeps its files."""
    if os.environ.get("TOOLKIT_KERNEL_CACHE"):
        return Path(os.environ["TOOLKIT_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolkit" / "kernels"
