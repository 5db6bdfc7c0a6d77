"""The bnb scheme factory: what registration needs, without the schemes themselves.

Every toolkit process registers this plugin; the schemes (with their parameter layouts and
option parsing) are imported by ``from_checkpoint`` / ``from_spec``, when a load asks for bnb.
"""
from __future__ import annotations

import torch

CHECKPOINT_SCHEME = "bnb"
SPEC_NAMES = ("bnb-nf4", "bnb-fp4", "bnb-int8")


class BnbFactory:
    """Registered under ``bnb`` (pre-quantized checkpoints) and the on-the-fly spec names."""

    names = (CHECKPOINT_SCHEME, *SPEC_NAMES)

    def from_checkpoint(self, quant_metadata, *, params_dtype: torch.dtype):
        from .options import from_quantization_config  # noqa: PLC0415
        from .scheme import make_scheme  # noqa: PLC0415

        return make_scheme(from_quantization_config(quant_metadata), params_dtype, prequantized=True)

    def from_spec(self, spec: str, *, params_dtype: torch.dtype):
        from .options import parse_spec  # noqa: PLC0415
        from .scheme import make_scheme  # noqa: PLC0415

        return make_scheme(parse_spec(spec), params_dtype, prequantized=False)
