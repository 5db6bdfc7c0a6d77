"""The LLM.int8 weight parameter: int8 rows (``data``) with one fp32 scale per row (``scb``).

Row scales make every tensor-parallel split exact: an output split takes rows and their
scales; an input split takes columns and keeps each row's scale (dequantization is
elementwise ``data * scb / 127``).
"""
from __future__ import annotations

import torch
from bitsandbytes.functional import int8_vectorwise_dequant, int8_vectorwise_quant

from toolkit.core.errors import MissingTensorError, ShapeMismatchError, UnexpectedTensorError

from .layout import Layout, Region, SegmentedParameter
from .options import Int8Options
from .tensors import Bnb8bitTensor


class Bnb8bitParameter(SegmentedParameter):
    def __new__(cls, data: torch.Tensor, *, layout: Layout, options: Int8Options, shard_ids,
                scb: torch.Tensor | None = None):
        param = super().__new__(cls, data, output_dim=0, input_dim=1, shard_ids=shard_ids)
        param.plan, param.options = layout, options
        param.scb = scb if scb is not None else torch.zeros(layout.num_rows, dtype=torch.float32, device=data.device)
        param._stored_parts = set()  # which of stored_state()'s parts load_stored has received
        return param

    @classmethod
    def empty(cls, layout: Layout, options: Int8Options, shard_ids, device=None) -> "Bnb8bitParameter":
        data = torch.zeros(layout.num_rows, layout.num_cols, dtype=torch.int8, device=device)
        return cls(data, layout=layout, options=options, shard_ids=shard_ids)

    def __deepcopy__(self, memo):
        copied = type(self)(self.data.clone(), layout=self.plan, options=self.options, shard_ids=self.shard_ids,
                            scb=self.scb.clone())
        copied.loaded_shards = set(self.loaded_shards)
        return copied

    def __reduce_ex__(self, protocol):
        return (_rebuild, (type(self), self.data, self.plan, self.options, self.shard_ids, self.scb,
                           self.loaded_shards))

    def segment_rows(self, segment: int) -> slice:
        start = self.plan.row_offset(segment)
        return slice(start, start + self.plan.segment_rows[segment])

    def dequantized(self) -> torch.Tensor:
        """This rank's [rows, cols] weight in full precision (``data * scb / 127``, bitsandbytes' own)."""
        return int8_vectorwise_dequant(self.data, self.scb)

    def stored_state(self) -> dict[str, torch.Tensor]:
        return {"": self.data, "scb": self.scb}

    def load_stored(self, loaded, *, part: str = "") -> None:
        target = {"": self.data, "scb": self.scb}.get(part)
        if target is None:
            raise UnexpectedTensorError(f"{self.plan.prefix}: an int8 weight has no stored part {part!r}")
        if not isinstance(loaded, torch.Tensor) or tuple(loaded.shape) != tuple(target.shape):
            raise ShapeMismatchError(f"{self.plan.prefix}: stored part {part!r} has shape "
                                     f"{tuple(getattr(loaded, 'shape', ()))}, expected {tuple(target.shape)}")
        target.copy_(loaded)
        self._stored_parts.add(part)
        self.mark_stored()

    def missing_shards(self) -> set:
        incomplete = getattr(self, "is_stored", False) and self._stored_parts != {"", "scb"}
        return super().missing_shards() | (set(self.shard_ids) if incomplete else set())

    def _load_region(self, loaded, region: Region) -> None:
        if isinstance(loaded, Bnb8bitTensor):
            data, scb = loaded.validated()
            self._check_source_shape(data.shape, region, f"int8 weight {loaded.name}")
            rows, scb = data[region.rows, region.cols], scb[region.rows]
        elif isinstance(loaded, torch.Tensor) and loaded.is_floating_point():
            self._check_source_shape(loaded.shape, region, "the weight")
            if self.plan.prequantized:
                self.plan.log.quantized_on_load.append(self.plan.prefix)
            # transformers' Int8Params quantizes the fp16 weight; doing the same keeps the scales identical
            chunk = loaded[region.rows, region.cols].to(device=self.data.device, dtype=torch.float16)
            rows, scb, _ = int8_vectorwise_quant(chunk.contiguous())
        else:
            raise MissingTensorError(f"{self.plan.prefix} is int8 quantized but got "
                                     f"{getattr(loaded, 'dtype', type(loaded).__name__)} data without its SCB scales")
        target = self.segment_rows(region.segment)
        self.data[target].copy_(rows)
        self.scb[target].copy_(scb)


def _rebuild(cls, data, layout, options, shard_ids, scb, loaded_shards):
    param = cls(data, layout=layout, options=options, shard_ids=shard_ids, scb=scb)
    param.loaded_shards = set(loaded_shards)
    return param
