"""The shape bookkeeping shared by the 4-bit and 8-bit parameters.

A layer's weight is a stack of segments, one per checkpoint shard (q, k, v for ``qkv_proj``;
gate, up for ``gate_up_proj``; one for a plain linear). Each segment is quantized on its own,
as transformers quantizes each ``nn.Linear`` on its own, and a placement from the layer
(rows or columns of one checkpoint tensor) becomes (segment, source rows, source columns).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from toolkit.core.errors import ShapeMismatchError, ShardingError
from toolkit.core.params import ModelParameter, Placement

from .notes import NoteLog


@dataclass(frozen=True)
class Layout:
    """:param segment_rows: this rank's rows per segment; :param num_cols: this rank's columns;
    :param full_rows: each segment's rows in the checkpoint; :param full_cols: checkpoint columns."""

    prefix: str
    segment_rows: tuple[int, ...]
    num_cols: int
    full_rows: tuple[int, ...]
    full_cols: int
    dtype: torch.dtype
    prequantized: bool
    log: NoteLog

    @classmethod
    def of(cls, layer: nn.Module, *, input_size_per_partition: int, output_partition_sizes: list[int],
           input_size: int, output_size: int, dtype: torch.dtype, prequantized: bool, log: NoteLog) -> "Layout":
        full_rows = tuple(getattr(layer, "output_sizes", None) or [output_size])
        if len(full_rows) != len(output_partition_sizes):
            full_rows = (output_size,) * len(output_partition_sizes)
        return cls(getattr(layer, "prefix", "?"), tuple(output_partition_sizes), input_size_per_partition,
                   full_rows, input_size, dtype, prequantized, log)

    @property
    def num_rows(self) -> int:
        return sum(self.segment_rows)

    def row_offset(self, segment: int) -> int:
        return sum(self.segment_rows[:segment])

    def segment_at(self, dest_offset: int) -> int:
        offsets = [self.row_offset(i) for i in range(len(self.segment_rows))]
        if dest_offset not in offsets:
            raise ShardingError(f"{self.prefix}: no weight segment starts at row {dest_offset}")
        return offsets.index(dest_offset)

    def expected_shape(self, segment: int) -> tuple[int, int]:
        return self.full_rows[segment], self.full_cols


@dataclass(frozen=True)
class Region:
    """Source rows and columns of one checkpoint tensor that go into ``segment``."""

    segment: int
    rows: slice
    cols: slice

    def is_whole(self, shape: tuple[int, int]) -> bool:
        return (self.rows.start, self.rows.stop, self.cols.start, self.cols.stop) == (0, shape[0], 0, shape[1])


class SegmentedParameter(ModelParameter):
    """Turns the layer's placements into Regions; subclasses implement ``_load_region``."""

    plan: Layout

    def _local_size(self, axis) -> int:
        return self.plan.num_rows if axis == "output" else self.plan.num_cols

    def _load_placed(self, loaded, placement: Placement) -> None:
        layout = self.plan
        if placement.axis == "output" and self._is_piece(loaded, placement):
            self._stage_rows(loaded, placement)
            return
        if placement.axis == "output":
            segment = layout.segment_at(placement.dest_offset)
            if placement.size != layout.segment_rows[segment] or layout.num_cols != layout.full_cols:
                raise ShapeMismatchError(f"{layout.prefix}: {placement.size} rows do not fill segment {segment}")
            region = Region(segment, _span(placement.source_start, placement.size), slice(0, layout.full_cols))
        else:
            if len(layout.segment_rows) != 1 or layout.segment_rows[0] != layout.full_rows[0]:
                raise ShardingError(f"{layout.prefix}: a fused or row-split weight cannot also be split by columns")
            region = Region(0, slice(0, layout.full_rows[0]), _span(placement.source_start, placement.size))
        self._load_region(loaded, region)
        self.loaded_shards.add(placement.shard_id)

    # ---- a segment assembled from pieces ---------------------------------------------------------
    # Some layers fill one segment from several row blocks, or from part of a larger checkpoint
    # tensor (Gated DeltaNet: q, k and v rows inside one in_proj_qkv, or interleaved per key head).
    # Dense rows are staged until the segment is complete, then quantized as one segment.
    def _is_piece(self, loaded, placement: Placement) -> bool:
        if not (isinstance(loaded, torch.Tensor) and loaded.is_floating_point()):
            return False
        offsets = [self.plan.row_offset(i) for i in range(len(self.plan.segment_rows))]
        if placement.dest_offset not in offsets:
            return True
        segment = offsets.index(placement.dest_offset)
        return placement.size != self.plan.segment_rows[segment] or loaded.shape[0] != self.plan.full_rows[segment]

    def _stage_rows(self, loaded: torch.Tensor, placement: Placement) -> None:
        layout = self.plan
        offsets = [layout.row_offset(i) for i in range(len(layout.segment_rows))]
        segment = max(i for i, offset in enumerate(offsets) if offset <= placement.dest_offset)
        start = placement.dest_offset - offsets[segment]
        if start + placement.size > layout.segment_rows[segment] or loaded.shape[1] != layout.full_cols:
            raise ShapeMismatchError(f"{layout.prefix}: rows [{placement.dest_offset}, "
                                     f"{placement.dest_offset + placement.size}) of {loaded.shape[1]} columns do not "
                                     f"fit segment {segment}")
        staged = self.__dict__.setdefault("_staged", {})
        buffer, filled = staged.get(segment) or (torch.zeros(layout.segment_rows[segment], layout.full_cols,
                                                             dtype=loaded.dtype), 0)
        buffer[start:start + placement.size] = loaded[placement.source_start:placement.source_start + placement.size]
        filled += placement.size
        self.loaded_shards.add(placement.shard_id)
        if filled < layout.segment_rows[segment]:
            staged[segment] = (buffer, filled)
            return
        staged.pop(segment, None)
        self.__dict__["_assembled"] = True  # this rank's rows only: the full-shape check does not apply
        try:
            self._load_region(buffer, Region(segment, slice(0, buffer.shape[0]), slice(0, layout.full_cols)))
        finally:
            self.__dict__["_assembled"] = False

    def _store_whole(self, loaded) -> None:
        layout = self.plan
        if len(layout.segment_rows) != 1:
            raise ShardingError(f"{layout.prefix}: a fused weight needs shard ids, got one whole tensor")
        self._load_region(loaded, Region(0, slice(0, layout.full_rows[0]), slice(0, layout.full_cols)))

    def _load_region(self, loaded, region: Region) -> None:
        raise NotImplementedError

    def _check_source_shape(self, shape, region: Region, what: str) -> None:
        if self.__dict__.get("_assembled"):
            expected = (self.plan.segment_rows[region.segment], self.plan.full_cols)
        else:
            expected = self.plan.expected_shape(region.segment)
        if tuple(shape) != expected:
            raise ShapeMismatchError(f"{what} has shape {tuple(shape)}, but {self.plan.prefix} (segment "
                                     f"{region.segment}) needs {expected}")

    @property
    def logical_numel(self) -> int:
        return self.plan.num_rows * self.plan.num_cols


def _span(start: int, size: int) -> slice:
    return slice(start, start + size)
