"""A bitsandbytes weight as a checkpoint delivers it: the packed data plus its companion tensors.

transformers saves a 4-bit weight as ``X.weight`` (packed uint8) next to ``X.weight.absmax``,
``X.weight.quant_map``, optionally ``X.weight.nested_absmax`` / ``X.weight.nested_quant_map``, and
``X.weight.quant_state.bitsandbytes__nf4|fp4`` (a JSON blob: type, block size, shape...); an
8-bit weight as ``X.weight`` (int8) with ``X.SCB`` (one fp32 scale per row) and ``X.weight_format``.
The bnb loader groups these into one object per weight, so a parameter receives the whole state.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import torch
from typing import TYPE_CHECKING

from toolkit.core.errors import CorruptFileError, MissingTensorError, ShapeMismatchError, UnsupportedQuantTypeError

from .options import BLOCK_SIZES, QUANT_TYPES

if TYPE_CHECKING:
    from bitsandbytes.functional import QuantState

STATE_PREFIX = "quant_state.bitsandbytes__"
ROW_FORMAT = 0  # the only int8 layout bitsandbytes writes since 0.45 ("row")


@dataclass
class Bnb4bitTensor:
    """``name`` is the weight's checkpoint name; ``stats`` maps companion suffixes (``absmax``...) to tensors."""

    name: str
    packed: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    file: str | None = None

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + sum(t.nbytes for t in self.stats.values())

    def quant_state(self, device: torch.device | str = "cpu") -> QuantState:
        """The validated bitsandbytes QuantState (typed errors name the companion tensor at fault)."""
        return parse_quant_state(self, device)

    def to_dense(self) -> torch.Tensor:
        """The dequantized [rows, cols] weight (bitsandbytes' own dequantize_4bit)."""
        from .dequant import dequantize_4bit  # noqa: PLC0415 - bitsandbytes is imported on use (see __init__)

        state = self.quant_state()
        return dequantize_4bit(self.packed_bytes(), state).reshape(tuple(state.shape))

    def packed_bytes(self) -> torch.Tensor:
        """The packed data as flat bytes, whatever storage dtype (``bnb_4bit_quant_storage``) it was saved in."""
        return self.packed.contiguous().view(torch.uint8).reshape(-1)


@dataclass
class Bnb8bitTensor:
    """An LLM.int8 weight: int8 ``data`` [rows, cols] and ``scb`` [rows] (None when the file lacks it)."""

    name: str
    data: torch.Tensor
    scb: torch.Tensor | None
    weight_format: torch.Tensor | None = None
    file: str | None = None

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (self.scb.nbytes if self.scb is not None else 0)

    def validated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(data, scb)`` after checking dtypes, shapes and the layout tag."""
        if self.scb is None:
            raise MissingTensorError("int8 weight has no SCB (row scales) tensor", file=self.file,
                                     tensor=_scb_name(self.name))
        if self.weight_format is not None and int(self.weight_format.reshape(-1)[0]) != ROW_FORMAT:
            raise UnsupportedQuantTypeError(f"int8 weight_format {int(self.weight_format.reshape(-1)[0])} is not the "
                                            "row-major layout (0)", file=self.file, tensor=self.name + "_format")
        if self.data.dtype != torch.int8 or self.data.dim() != 2:
            raise ShapeMismatchError(f"int8 weight must be a 2-D int8 tensor, got {self.data.dtype} "
                                     f"{tuple(self.data.shape)}", file=self.file, tensor=self.name)
        if tuple(self.scb.shape) != (self.data.shape[0],):
            raise ShapeMismatchError(f"SCB has shape {tuple(self.scb.shape)}, expected ({self.data.shape[0]},) "
                                     "(one scale per weight row)", file=self.file, tensor=_scb_name(self.name))
        return self.data, self.scb.float()

    def to_dense(self) -> torch.Tensor:
        from bitsandbytes.functional import int8_vectorwise_dequant  # noqa: PLC0415

        data, scb = self.validated()
        return int8_vectorwise_dequant(data, scb)


def _scb_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "SCB"


def parse_quant_state(tensor: Bnb4bitTensor, device) -> QuantState:
    meta = state_meta(tensor)
    required = ["absmax", "quant_map"] + (["nested_absmax", "nested_quant_map"] if "nested_offset" in meta else [])
    for key in required:
        if key not in tensor.stats:
            raise MissingTensorError(f"4-bit weight is missing its {key} statistics", file=tensor.file,
                                     tensor=f"{tensor.name}.{key}")
    _check_sizes(tensor, meta)
    parts = {key: tensor.stats[key] for key in required}
    for key, value in parts.items():
        if not value.dtype.is_floating_point and value.dtype != torch.uint8 or value.dim() == 0 and key != "absmax":
            raise CorruptFileError(f"{key} is a {value.dtype} {tuple(value.shape)} tensor; expected float statistics",
                                   file=tensor.file, tensor=f"{tensor.name}.{key}")
    if parts["quant_map"].numel() != 16 or (parts.get("nested_quant_map") is not None
                                            and parts["nested_quant_map"].numel() != 256):
        raise ShapeMismatchError("quant_map must hold 16 values (nested_quant_map 256)", file=tensor.file,
                                 tensor=f"{tensor.name}.quant_map")
    from bitsandbytes.functional import QuantState  # noqa: PLC0415

    try:
        return QuantState.from_dict({**parts, **meta}, device=torch.device(device))
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError) as exc:
        raise CorruptFileError(f"bitsandbytes cannot read this quant_state: {type(exc).__name__}: {exc}",
                               file=tensor.file, tensor=tensor.name) from exc


def state_meta(tensor: Bnb4bitTensor) -> dict:
    """The decoded ``quant_state.bitsandbytes__*`` JSON (type, block size, shape, nested fields)."""
    keys = [key for key in tensor.stats if key.startswith("quant_state")]
    if not keys:
        raise MissingTensorError("4-bit weight has no quant_state.bitsandbytes__nf4|fp4 entry", file=tensor.file,
                                 tensor=f"{tensor.name}.{STATE_PREFIX}nf4")
    key = keys[0]
    kind = key.removeprefix(STATE_PREFIX)
    if len(keys) > 1 or not key.startswith(STATE_PREFIX) or kind not in QUANT_TYPES:
        raise UnsupportedQuantTypeError(f"unknown 4-bit quant type {', '.join(keys)} (expected one of "
                                        f"{', '.join(STATE_PREFIX + t for t in QUANT_TYPES)})",
                                        file=tensor.file, tensor=f"{tensor.name}.{key}")
    try:
        meta = json.loads(bytes(tensor.stats[key].to(torch.uint8).tolist()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptFileError(f"quant_state is not JSON: {exc}", file=tensor.file, tensor=f"{tensor.name}.{key}")
    if not isinstance(meta, dict):
        raise CorruptFileError(f"quant_state is a JSON {type(meta).__name__}, not an object", file=tensor.file,
                               tensor=f"{tensor.name}.{key}")
    if meta.get("quant_type") != kind:
        raise UnsupportedQuantTypeError(f"quant_state says quant_type {meta.get('quant_type')!r} but is named {kind}",
                                        file=tensor.file, tensor=f"{tensor.name}.{key}")
    for item in ("blocksize", "shape", "dtype"):
        if item not in meta:
            raise CorruptFileError(f"quant_state lacks {item!r}", file=tensor.file, tensor=f"{tensor.name}.{key}")
    _check_meta_values(meta, file=tensor.file, where=f"{tensor.name}.{key}")
    return meta


FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _check_meta_values(meta: dict, *, file: str | None, where: str) -> None:
    """Types and ranges of the quant_state fields bitsandbytes' QuantState.from_dict trusts."""
    def fail(message: str):
        return CorruptFileError(f"quant_state {message}", file=file, tensor=where)

    for item in ("blocksize", "nested_blocksize"):
        if item in meta and (type(meta[item]) is not int or meta[item] not in BLOCK_SIZES):
            raise fail(f"{item} {meta[item]!r} is not one of {BLOCK_SIZES}")
    shape = meta["shape"]
    if not isinstance(shape, list) or len(shape) != 2 or any(type(d) is not int or not 0 < d < 1 << 31 for d in shape):
        raise fail(f"shape {shape!r} is not two positive integers")
    for item in ("dtype", "nested_dtype"):
        if item in meta and meta[item] not in FLOAT_DTYPES:
            raise fail(f"{item} {meta[item]!r} is not one of {FLOAT_DTYPES}")
    if "nested_offset" in meta:
        offset = meta["nested_offset"]
        if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
            raise fail(f"nested_offset {offset!r} is not a finite number")


def _check_sizes(tensor: Bnb4bitTensor, meta: dict) -> None:
    """The packed data and statistics must hold exactly what the quant_state's shape needs."""
    shape = meta["shape"]
    if not isinstance(shape, list) or len(shape) != 2:
        raise ShapeMismatchError(f"quant_state shape {shape} is not a 2-D weight shape", file=tensor.file,
                                 tensor=tensor.name)
    numel = shape[0] * shape[1]
    expected = {"": (math.ceil(numel / 2), tensor.packed_bytes().numel()),
                ".absmax": (math.ceil(numel / meta["blocksize"]), tensor.stats["absmax"].numel())}
    if "nested_absmax" in tensor.stats and "nested_blocksize" in meta:
        expected[".nested_absmax"] = (math.ceil(expected[".absmax"][0] / meta["nested_blocksize"]),
                                      tensor.stats["nested_absmax"].numel())
    for suffix, (wanted, found) in expected.items():
        if wanted != found:
            raise ShapeMismatchError(f"quant_state shape {shape} (block size {meta['blocksize']}) needs {wanted} "
                                     f"entries here, found {found}", file=tensor.file, tensor=tensor.name + suffix)
