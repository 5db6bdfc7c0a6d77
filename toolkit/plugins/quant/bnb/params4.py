"""The 4-bit (NF4/FP4) weight parameter: packed bytes per segment, one bitsandbytes QuantState each.

It takes either a full-precision tensor (on-the-fly: the rank's slice is cut first and only
that is quantized, so the full-precision weight never lives on the device) or a Bnb4bitTensor
from a pre-quantized checkpoint (sliced on block boundaries, else re-quantized; see blocks.py).
"""
from __future__ import annotations

import torch
from bitsandbytes.functional import QuantState

from toolkit.core.errors import MissingTensorError, ShapeMismatchError, ShardingError, UnexpectedTensorError

from . import blocks
from .dequant import dequantize_4bit
from .layout import Layout, Region, SegmentedParameter
from .options import FourBitOptions
from .tensors import Bnb4bitTensor, state_meta


class Bnb4bitParameter(SegmentedParameter):
    """``data``: flat uint8, segment ``i`` at bytes [row_offset(i) * cols / 2, ...); ``quant_states[i]``."""

    def __new__(cls, data: torch.Tensor, *, layout: Layout, options: FourBitOptions, shard_ids):
        for rows in layout.segment_rows:
            if rows * layout.num_cols % 2:
                raise ShardingError(f"{layout.prefix}: a {rows}x{layout.num_cols} segment has an odd number of "
                                    "4-bit values")
        param = super().__new__(cls, data, output_dim=0, input_dim=1, shard_ids=shard_ids)
        param.plan, param.options = layout, options
        param.quant_states = [None] * len(layout.segment_rows)
        param._stored_stats = {}  # segment -> stored statistics received so far (load_stored)
        param.statistics_gathered = False  # gather_statistics() ran since the last quant state arrived
        return param

    @classmethod
    def empty(cls, layout: Layout, options: FourBitOptions, shard_ids, device=None) -> "Bnb4bitParameter":
        data = torch.zeros(layout.num_rows * layout.num_cols // 2, dtype=torch.uint8, device=device)
        return cls(data, layout=layout, options=options, shard_ids=shard_ids)

    def __deepcopy__(self, memo):
        copied = type(self)(self.data.clone(), layout=self.plan, options=self.options, shard_ids=self.shard_ids)
        copied.quant_states, copied.loaded_shards = list(self.quant_states), set(self.loaded_shards)
        return copied

    def __reduce_ex__(self, protocol):
        return (_rebuild, (type(self), self.data, self.plan, self.options, self.shard_ids, self.quant_states,
                           self.loaded_shards))

    # ---- reading --------------------------------------------------------------------------
    def segment_bytes(self, segment: int) -> torch.Tensor:
        start = self.plan.row_offset(segment) * self.plan.num_cols // 2
        return self.data[start: start + self.plan.segment_rows[segment] * self.plan.num_cols // 2]

    def segments(self) -> list[tuple[torch.Tensor, QuantState]]:
        """``(packed bytes, QuantState)`` per segment, in output-row order."""
        return [(self.segment_bytes(i), state) for i, state in enumerate(self.quant_states)]

    def gather_statistics(self) -> bool:
        """Lay the segments' statistics back to back (``gather_states``) so one kernel launch reads every
        segment of a fused projection; False where they cannot be (a segment missing or unlike the
        others, or a CUDA graph being captured, which allows no new buffers to keep)."""
        if not self.statistics_gathered and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return False
        if not self.statistics_gathered:
            self.statistics_gathered = gather_states(self.quant_states)
        return self.statistics_gathered

    def dequantized(self) -> torch.Tensor:
        """This rank's [rows, cols] weight in full precision (bitsandbytes' dequantize_4bit per segment)."""
        return torch.cat([dequantize_4bit(packed.view(-1, 1), state) for packed, state in self.segments()])

    def missing_shards(self) -> set:
        """Shards never loaded, and those whose quant state never arrived (e.g. a partial stored state)."""
        lacking = {self.shard_ids[i] if len(self.shard_ids) == len(self.quant_states) else None
                   for i, state in enumerate(self.quant_states) if state is None}
        return super().missing_shards() | lacking

    # ---- stored state: packed bytes plus each segment's QuantState, as bitsandbytes serializes it --
    def stored_state(self) -> dict[str, torch.Tensor]:
        state = {"": self.data}
        for i, quant_state in enumerate(self.quant_states):
            if quant_state is not None:  # gathered statistics are views of shared buffers: saved standalone
                state.update({f"segment{i}.{key}": value.clone() if isinstance(value, torch.Tensor) else value
                              for key, value in quant_state.as_dict(packed=True).items()})
        return state

    def load_stored(self, loaded, *, part: str = "") -> None:
        if part == "":
            if not isinstance(loaded, torch.Tensor) or loaded.numel() != self.data.numel():
                raise ShapeMismatchError(f"{self.plan.prefix}: stored packed data has "
                                         f"{getattr(loaded, 'numel', lambda: '?')()} bytes, expected {self.data.numel()}")
            self.data.copy_(loaded.reshape(-1).view(torch.uint8))
        else:
            segment, key = _stored_part(part, self.plan.prefix, len(self.quant_states))
            self._stored_stats.setdefault(segment, {})[key] = loaded
            self._restore_state(segment)
        self.mark_stored()

    def _restore_state(self, segment: int) -> None:
        stats = self._stored_stats[segment]
        tensor = Bnb4bitTensor(f"{self.plan.prefix}.weight (segment {segment})", self.segment_bytes(segment), stats)
        if not any(key.startswith("quant_state.") for key in stats):
            return
        nested = "nested_offset" in state_meta(tensor)
        if {"absmax", "quant_map"} | ({"nested_absmax", "nested_quant_map"} if nested else set()) <= stats.keys():
            self._store_state(segment, tensor.quant_state(self.data.device))

    # ---- loading --------------------------------------------------------------------------
    def _load_region(self, loaded, region: Region) -> None:
        if isinstance(loaded, Bnb4bitTensor):
            packed, state = self._cut(loaded, region)
        elif isinstance(loaded, torch.Tensor) and loaded.is_floating_point():
            self._check_source_shape(loaded.shape, region, "the weight")
            if self.plan.prequantized:
                self.plan.log.quantized_on_load.append(self.plan.prefix)
            packed, state = self._quantize(loaded[region.rows, region.cols])
        else:
            raise MissingTensorError(f"{self.plan.prefix} is 4-bit quantized but got "
                                     f"{getattr(loaded, 'dtype', type(loaded).__name__)} data without its quant_state "
                                     "and absmax statistics")
        self._store(region.segment, packed, state)

    def _quantize(self, dense: torch.Tensor):
        dense = dense.to(device=self.data.device, dtype=self.plan.dtype)
        return blocks.quantize_packed(dense, quant_type=self.options.quant_type, block_size=self.options.block_size,
                                      double_quant=self.options.double_quant)

    def _cut(self, tensor: Bnb4bitTensor, region: Region):
        """This rank's part of a pre-quantized tensor (bitsandbytes work on CPU, result moved after)."""
        state, packed = tensor.quant_state("cpu"), tensor.packed_bytes()
        self._check_source_shape(tuple(state.shape), region, f"quant_state of {tensor.name}")
        shape = tuple(state.shape)
        if region.is_whole(shape):
            return packed, state
        if region.cols == slice(0, shape[1]):
            cut = blocks.slice_rows(packed, state, region.rows.start, region.rows.stop - region.rows.start)
        else:
            cut = blocks.slice_cols(packed, state, region.cols.start, region.cols.stop - region.cols.start)
        if cut is None:
            self.plan.log.requantized.append(tensor.name)
            return blocks.requantize(packed, state, region.rows, region.cols, double_quant=state.nested)
        if state.nested and not cut[1].nested:
            self.plan.log.unnested.append(tensor.name)
        return cut

    def _store(self, segment: int, packed: torch.Tensor, state: QuantState) -> None:
        target = self.segment_bytes(segment)
        expected = (self.plan.segment_rows[segment], self.plan.num_cols)
        if packed.numel() != target.numel() or tuple(state.shape) != expected:
            raise ShapeMismatchError(f"{self.plan.prefix}: 4-bit data for shape {tuple(state.shape)} "
                                     f"({packed.numel()} bytes) does not fit segment {segment} of shape {expected}")
        target.copy_(packed.reshape(-1))
        self._store_state(segment, state)

    def _store_state(self, segment: int, state: QuantState) -> None:
        expected = (self.plan.segment_rows[segment], self.plan.num_cols)
        if tuple(state.shape) != expected:
            raise ShapeMismatchError(f"{self.plan.prefix}: quant state of shape {tuple(state.shape)} does not fit "
                                     f"segment {segment} of shape {expected}")
        state.absmax = state.absmax.clone()  # a slice's view would keep the whole tensor's statistics alive
        if state.nested:
            state.state2.absmax = state.state2.absmax.clone()
        state.to(self.data.device)
        self.quant_states[segment] = state
        self.statistics_gathered = False


def gather_states(states) -> bool:
    """Move each statistic of the segments (absmax, codebook; with double quantization also the nested
    absmax, nested codebook and offset) into one buffer, segment ``i + 1``'s right after segment ``i``'s,
    each QuantState keeping a view of its own part (no copy stays behind). bitsandbytes reads the
    views as before; ``bnb_4bit_matmul_segments`` then runs all segments in one launch. False (nothing
    moved) where a segment is missing or the segments differ in type, block sizes or device."""
    if len(states) < 2 or any(state is None for state in states):
        return len(states) == 1 and states[0] is not None
    first = states[0]

    def same(get) -> bool:
        return all(get(state) == get(first) for state in states)

    if not (same(lambda s: s.quant_type) and same(lambda s: int(s.blocksize)) and same(lambda s: bool(s.nested))
            and same(lambda s: (s.absmax.dtype, s.absmax.device, s.code.dtype))):
        return False
    if first.nested and not (same(lambda s: int(s.state2.blocksize))
                             and same(lambda s: (s.state2.absmax.dtype, s.state2.code.dtype, s.offset.dtype))):
        return False
    for state, view in zip(states, _gathered([state.absmax for state in states])):
        state.absmax = view
    for state, view in zip(states, _gathered([state.code for state in states])):
        state.code = view
    if first.nested:
        for state, view in zip(states, _gathered([state.state2.absmax for state in states])):
            state.state2.absmax = view
        for state, view in zip(states, _gathered([state.state2.code for state in states])):
            state.state2.code = view
        for state, view in zip(states, _gathered([torch.as_tensor(state.offset) for state in states])):
            state.offset = view
    return True


def _gathered(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views, of the tensors' shapes, into one new buffer holding them back to back."""
    buffer = torch.cat([tensor.reshape(-1) for tensor in tensors])
    views, start = [], 0
    for tensor in tensors:
        views.append(buffer[start: start + tensor.numel()].view(tensor.shape))
        start += tensor.numel()
    return views


def _stored_part(part: str, prefix: str, num_segments: int) -> tuple[int, str]:
    """``"segment1.absmax"`` -> (1, ``"absmax"``)."""
    head, _, key = part.partition(".")
    index = head.removeprefix("segment")
    if not head.startswith("segment") or not index.isdigit() or int(index) >= num_segments or not key:
        raise UnexpectedTensorError(f"{prefix}: a 4-bit weight has no stored part {part!r}")
    return int(index), key


def _rebuild(cls, data, layout, options, shard_ids, quant_states, loaded_shards):
    param = cls(data, layout=layout, options=options, shard_ids=shard_ids)
    param.quant_states, param.loaded_shards = list(quant_states), set(loaded_shards)
    return param
