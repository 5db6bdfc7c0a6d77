"""GGUFParameter: a weight kept as the file's packed GGUF rows, sharding itself.

A logical ``[rows, cols]`` weight is stored as uint8 rows of GGUF blocks. Sharding never
dequantizes:

* an output-dim split (column-parallel, merged, qkv, vocab rows) takes whole packed rows;
* an input-dim split (row-parallel) takes a byte range of every row, which exists only when the
  split falls on block boundaries; otherwise ShardingError names the offending numbers.

A fused parameter (qkv_proj, gate_up_proj) may receive shards of different quant types
(Q4_K_M files mix Q4_K and Q6_K), so the storage is a list of *segments*: consecutive output
rows sharing one type. The type is known only when a tensor arrives, so shards are held (as
views of the memory-mapped file) until the last one arrives; ``finalize`` then copies them,
once, into ``self.data``: one flat uint8 buffer on the parameter's device.
"""
from __future__ import annotations

from typing import Any

import torch

from toolkit.core.errors import ShapeMismatchError, ShardingError, UnexpectedTensorError, UnsupportedQuantTypeError
from toolkit.core.params import ModelParameter, Placement
from toolkit.core.records import FrozenRecord
from toolkit.core.transfer import copy_into
from toolkit.kernels.gguf import block_size, bytes_per_row, is_supported, type_name, type_size

SEGMENT_FIELDS = 5  # row_start, rows, qtype, byte_offset, row_bytes
# GGML types F32, F16 and BF16: their torch dtypes, and the type that stores each torch dtype
FLOAT_DTYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}
FLOAT_QTYPES = {dtype: qtype for qtype, dtype in FLOAT_DTYPES.items()}


class Segment(FrozenRecord):
    """Output rows ``[row_start, row_start + rows)`` stored as ``qtype`` rows of ``row_bytes``
    bytes, at ``byte_offset`` in the parameter's flat buffer. (A hand-written record, not a
    dataclass: a GGUF load imports this module; toolkit/core/records.py says why.)"""

    row_start: int
    rows: int
    qtype: int
    byte_offset: int
    row_bytes: int

    def __init__(self, row_start: int, rows: int, qtype: int, byte_offset: int, row_bytes: int):
        self.__dict__.update(row_start=row_start, rows=rows, qtype=qtype, byte_offset=byte_offset,
                             row_bytes=row_bytes)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


class GGUFParameter(ModelParameter):
    """Packed GGUF storage for a logical ``[rows, cols]`` weight (output dim 0, input dim 1)."""

    def __new__(cls, data: torch.Tensor, *, output_dim: int | None = 0, input_dim: int | None = 1,
                shard_ids: tuple[int | None, ...] = (None,), logical_shape: tuple[int, int] = (0, 0),
                num_experts: int = 1):
        param = super().__new__(cls, data, output_dim=output_dim, input_dim=input_dim, shard_ids=shard_ids)
        param.logical_shape = tuple(int(d) for d in logical_shape)
        param.pending = {}  # (row_start) -> (qtype, uint8 rows) until finalize
        param.segments = ()
        param.num_experts = num_experts  # > 1: experts stacked along the rows, logical_shape[0] / E each
        return param

    @classmethod
    def empty(cls, rows: int, cols: int, *, shard_ids: tuple[int | None, ...], num_experts: int = 1) -> "GGUFParameter":
        """A parameter with no bytes yet, on the current default device (the layer's device). Expert
        weights ``[E, rows, cols]`` are held as ``[E * rows, cols]`` (expert-major rows)."""
        return cls(torch.empty(0, dtype=torch.uint8), shard_ids=shard_ids, logical_shape=(num_experts * rows, cols),
                   num_experts=num_experts)

    def __deepcopy__(self, memo):
        copied = type(self)(self.data.clone(), shard_ids=self.shard_ids, logical_shape=self.logical_shape,
                            num_experts=self.num_experts)
        copied.pending = {k: (q, d.clone()) for k, (q, d) in self.pending.items()}
        copied.segments, copied.loaded_shards = self.segments, set(self.loaded_shards)
        return copied

    def __reduce_ex__(self, protocol):
        self.finalize()
        return (_rebuild, (type(self), self.data, self.shard_ids, self.logical_shape, self.segments,
                           self.loaded_shards, self.num_experts))

    @property
    def logical_numel(self) -> int:
        return self.logical_shape[0] * self.logical_shape[1]

    # ---- storage hooks (the load_* calls of ModelParameter end here) ------------------------
    def _local_size(self, axis) -> int:
        return self.logical_shape[0] if axis == "output" else self.logical_shape[1]

    def load_replicated(self, loaded: Any) -> None:
        super().load_replicated(loaded)
        self.finalize()

    def _store_whole(self, loaded: Any) -> None:
        tensor = self._check(loaded)
        if tuple(tensor.shape) != self.logical_shape:
            raise ShapeMismatchError(f"shape mismatch for whole tensor: model expects {self.logical_shape}, "
                                     f"checkpoint has {tuple(tensor.shape)}")
        self._keep(0, tensor.qtype, tensor.data)

    def _load_placed(self, loaded: Any, placement: Placement) -> None:
        tensor = self._check(loaded)
        dest_row, rows = 0, self.logical_shape[0]
        if placement.expert is not None:  # experts are stacked along the rows: [E * rows_per_expert, cols]
            tensor = _one_expert(tensor, placement.source_expert)
            rows = self.logical_shape[0] // self.num_experts
            dest_row = placement.expert * rows
        if placement.axis == "output":
            self._load_rows(tensor, Placement("output", placement.source_start, placement.size,
                                              dest_row + placement.dest_offset, placement.shard_id))
        else:
            self._load_columns(tensor, placement, dest_row=dest_row, rows=rows)
        self.loaded_shards.add(placement.shard_id)
        if not self.missing_shards():
            self.finalize()

    def _load_rows(self, tensor, placement: Placement) -> None:
        rows, cols = _matrix_shape(tensor)
        if cols != self.logical_shape[1] or placement.source_start + placement.size > rows:
            raise ShapeMismatchError(f"needs rows [{placement.source_start}, {placement.source_start + placement.size})"
                                     f" of {self.logical_shape[1]} columns, the checkpoint tensor is {rows} x {cols}")
        if placement.dest_offset + placement.size > self.logical_shape[0]:
            raise ShapeMismatchError(f"rows [{placement.dest_offset}, {placement.dest_offset + placement.size}) "
                                     f"do not fit a parameter of {self.logical_shape[0]} rows")
        data = tensor.data.narrow(0, placement.source_start, placement.size)
        self._keep(placement.dest_offset, tensor.qtype, data)

    def _load_columns(self, tensor, placement: Placement, *, dest_row: int = 0, rows: int | None = None) -> None:
        expected = self.logical_shape[0] if rows is None else rows
        rows, cols = _matrix_shape(tensor)
        start, size, block = placement.source_start, placement.size, block_size(tensor.qtype)
        if rows != expected or start + size > cols or size != self.logical_shape[1]:
            raise ShapeMismatchError(f"needs columns [{start}, {start + size}) of {self.logical_shape[0]} rows, "
                                     f"the checkpoint tensor is {rows} x {cols}")
        if start % block or size % block:
            raise ShardingError(f"tensor-parallel split of the input dimension at columns [{start}, {start + size}) "
                                f"cuts {type_name(tensor.qtype)} blocks of {block} elements; use a tp size that "
                                f"divides {cols // block} blocks per row")
        first, count = start // block * type_size(tensor.qtype), size // block * type_size(tensor.qtype)
        self._keep(dest_row, tensor.qtype, tensor.data.narrow(1, first, count))

    def _check(self, loaded: Any):
        if not hasattr(loaded, "qtype") or not hasattr(loaded, "data"):
            raise ShapeMismatchError(f"a packed GGUF parameter got {type(loaded).__name__}, not a GGUF tensor")
        if not is_supported(loaded.qtype):
            # the load pipeline adds the file and tensor name to the message
            raise UnsupportedQuantTypeError(f"GGUF quantization type {type_name(loaded.qtype)} is not supported "
                                            f"by the gguf kernels")
        return loaded

    def _keep(self, row_start: int, qtype: int, data: torch.Tensor) -> None:
        """Hold the rows (usually a view of the file's map) until finalize copies them in."""
        self.pending[row_start] = (qtype, data)

    # ---- after loading --------------------------------------------------------------------
    def finalize(self) -> None:
        """Pack pending shards into ``self.data`` with one copy; runs of equal type become one segment."""
        if not self.pending:
            return
        runs = _merge_runs(self._pieces())
        segments, offset = [], 0
        for start, qtype, parts in runs:
            rows = sum(part.shape[0] for part in parts)
            segments.append(Segment(start, rows, qtype, offset, parts[0].shape[1]))
            offset += rows * parts[0].shape[1]
        flat = torch.empty(offset, dtype=torch.uint8, device=self.data.device)
        for segment, (_, _, parts) in zip(segments, runs):
            _copy_rows(flat, segment, parts)
        self.data, self.segments, self.pending = flat, tuple(segments), {}

    def _pieces(self) -> list[tuple[int, int, torch.Tensor]]:
        """(row_start, qtype, rows) in row order: pending shards, plus packed segments they do not
        replace (rows that arrive after an earlier finalize). A rank owning no real rows (vocab
        padding) has nothing to store."""
        pieces = [(start, qtype, data) for start, (qtype, data) in self.pending.items() if data.shape[0]]
        pieces += [(s.row_start, s.qtype, self.segment_data(s)) for s in self.segments
                   if s.row_start not in self.pending]
        return sorted(pieces, key=lambda piece: piece[0])

    def segment_data(self, segment: Segment) -> torch.Tensor:
        """uint8 ``[rows, row_bytes]`` view of one segment."""
        return self.data.narrow(0, segment.byte_offset, segment.nbytes).view(segment.rows, segment.row_bytes)

    def cast_float_segments(self, dtype: torch.dtype) -> None:
        """Store F32/F16/BF16 segments as ``dtype`` (the compute dtype), once, after loading.

        Why: a float segment in another dtype would otherwise be converted on every forward (a
        1.5B F16 file decoded with bf16 activations spent half of each step in casts). A model
        loaded from safetensors is cast to its compute dtype at load time the same way.
        """
        self.finalize()
        target = FLOAT_QTYPES.get(dtype)
        if target is None or not any(s.qtype in FLOAT_DTYPES and s.qtype != target for s in self.segments):
            return
        pieces = []
        for segment in self.segments:
            data = self.segment_data(segment)
            if segment.qtype in FLOAT_DTYPES and segment.qtype != target:
                values = data.contiguous().view(FLOAT_DTYPES[segment.qtype]).to(dtype)
                pieces.append((segment.row_start, target, values.view(torch.uint8)))
            else:
                pieces.append((segment.row_start, segment.qtype, data.clone()))
        self.pending = {start: (qtype, data) for start, qtype, data in pieces}
        self.segments = ()
        self.finalize()

    def packed_segments(self) -> tuple[tuple[Segment, torch.Tensor], ...]:
        """(segment, uint8 rows view) pairs. The views are cached: a decode step asks ~130 times per
        token, and building them (``Parameter.data`` makes a new tensor object, then narrow and view)
        was ~3% of a CPU decode step. The cache is keyed on the segment tuple and the buffer's address,
        which every path that replaces the bytes (finalize, load_stored, a device move) changes."""
        cached = self.__dict__.get("_segment_views")
        if cached is not None and not self.pending and cached[0] is self.segments and cached[1] == self.data_ptr():
            return cached[2]
        self.finalize()
        views = tuple((segment, self.segment_data(segment)) for segment in self.segments)
        self._segment_views = (self.segments, self.data_ptr(), views)
        return views

    # ---- stored state (tensorizer-style save/restore of the processed parameter) ---------
    def stored_state(self) -> dict[str, torch.Tensor]:
        self.finalize()
        table = torch.tensor([[s.row_start, s.rows, s.qtype, s.byte_offset, s.row_bytes] for s in self.segments],
                             dtype=torch.int64).reshape(-1, SEGMENT_FIELDS)
        return {"": self.data, "segments": table}

    def load_stored(self, loaded: Any, *, part: str = "") -> None:
        if part == "":
            self.data = loaded.to(device=self.data.device, dtype=torch.uint8).reshape(-1).clone()
        elif part == "segments":
            self.segments = tuple(Segment(*map(int, row)) for row in loaded.reshape(-1, SEGMENT_FIELDS).tolist())
        else:
            raise UnexpectedTensorError(f"a GGUFParameter has no stored part {part!r}")
        self.pending = {}
        self.mark_stored()


def _merge_runs(pieces: list[tuple[int, int, torch.Tensor]]) -> list[tuple[int, int, list[torch.Tensor]]]:
    """Adjacent pieces of one type (and row width) grouped, so a uniform qkv is one segment (one matmul)."""
    runs: list[tuple[int, int, list[torch.Tensor]]] = []
    for start, qtype, data in pieces:
        if runs:
            run_start, run_type, run_data = runs[-1]
            end = run_start + sum(d.shape[0] for d in run_data)
            if run_type == qtype and end == start and run_data[0].shape[1] == data.shape[1]:
                run_data.append(data)
                continue
        runs.append((start, qtype, [data]))
    return runs


def _copy_rows(flat: torch.Tensor, segment: Segment, parts: list[torch.Tensor]) -> None:
    """The only copy of the bytes: from the file's map (or an older buffer) into the segment."""
    row = 0
    for part in parts:
        target = flat.narrow(0, segment.byte_offset + row * segment.row_bytes, part.numel())
        copy_into(target.view(part.shape), part)  # staged through pinned memory during a CUDA load
        row += part.shape[0]


def _one_expert(tensor, source_expert: int | None):
    """The expert ``source_expert`` of a stacked ``[E, rows, cols]`` tensor (or the tensor itself when
    it holds one expert), as ``[rows, cols]`` packed rows."""
    if source_expert is None:
        if len(tensor.shape) != 2:
            raise ShapeMismatchError(f"one expert's tensor should be 2-D, got shape {tuple(tensor.shape)}")
        return tensor
    if len(tensor.shape) != 3 or source_expert >= tensor.shape[0]:
        raise ShapeMismatchError(f"needs expert {source_expert} of a stacked [experts, rows, cols] tensor, "
                                 f"got shape {tuple(tensor.shape)}")
    from .expert_rows import expert_rows  # noqa: PLC0415 - MoE loads only (see expert_rows.py)

    return expert_rows(tensor, source_expert)


def _matrix_shape(tensor) -> tuple[int, int]:
    """(rows, cols) of a GGUF tensor viewed as a matrix (leading dims fold into rows)."""
    shape = tuple(tensor.shape)
    cols = shape[-1]
    rows = tensor.data.shape[0]
    bytes_per_row(tensor.qtype, cols)  # raises if cols is not whole blocks
    return rows, cols


def _rebuild(cls, data, shard_ids, logical_shape, segments, loaded_shards, num_experts=1):
    param = cls(data, shard_ids=shard_ids, logical_shape=logical_shape, num_experts=num_experts)
    param.segments, param.loaded_shards = tuple(segments), set(loaded_shards)
    return param
