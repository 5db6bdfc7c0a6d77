"""Whether Triton kernels can register on this machine, and their lazy, failure-tolerant import.

Every Triton kernel package registers for CUDA only where a GPU and Triton exist, and imports its
kernels only then (Triton is optional and slow to import). A broken Triton install must not take
the torch reference ops down with it: the import failure becomes a one-line warning.
"""
from __future__ import annotations

import importlib
import importlib.util
import warnings

import torch


def triton_usable() -> bool:
    """A CUDA device is visible and Triton is installed."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def optional_ops(module: str, what: str) -> dict:
    """``module.OPS`` (op name -> CUDA function) where Triton is usable, else ``{}``.

    :param module: the absolute name of the module holding the Triton kernels' ``OPS``
    :param what: how the warning names them when the import fails
    """
    if not triton_usable():
        return {}
    try:
        return importlib.import_module(module).OPS
    except Exception as exc:  # noqa: BLE001 - any import failure leaves the references serving
        warnings.warn(f"{what} unavailable, using the torch reference: {exc}", stacklevel=3)
        return {}
