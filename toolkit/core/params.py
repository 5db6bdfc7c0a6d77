"""Parameters that carry their own sharding (the weight_loader_v2 idea).

A layer knows *which* slice of a checkpoint tensor belongs to its tensor-parallel rank and
where it goes (a Placement, in logical elements); the parameter knows *how* its storage
represents elements. Plain tensors copy a narrowed view; packed storages (quantized
bytes, 4-bit pairs) subclass and translate element offsets into their own units, refusing
with ShardingError a split their blocks cannot express.

Every parameter answers the same calls, so no layer branches on the scheme:
``load_replicated``, ``load_column_parallel``, ``load_row_parallel``,
``load_merged_column`` and ``load_qkv``.

The stored-state protocol is the fast path back into a running model: ``stored_state()``
returns the parameter exactly as it sits in memory (already sharded and processed) as named
plain tensors, and ``load_stored(tensor, part=...)`` puts each of them back unchanged.
Subclasses whose memory holds more than ``self.data`` override both.
"""
from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from .errors import ShapeMismatchError, ShardingError, UnexpectedTensorError
from .records import FrozenRecord
from .transfer import copy_into

Axis = Literal["output", "input"]


class Placement(FrozenRecord):
    """Take ``size`` elements from ``source_start`` along ``axis`` of the checkpoint tensor and put
    them at ``dest_offset`` along the same axis of this rank's parameter. (A hand-written record,
    not a dataclass: a load imports this module; records.py says why.)"""

    axis: Axis
    source_start: int
    size: int
    dest_offset: int
    shard_id: Any
    # Expert parameters ([experts, out, in]): ``expert`` is the local expert written; the
    # checkpoint tensor holds one expert ([out, in], ``source_expert`` None) or all of them
    # ([experts, out, in], ``source_expert`` picks one). Output/input axes are those of one expert.
    expert: int | None
    source_expert: int | None

    def __init__(self, axis: Axis, source_start: int, size: int, dest_offset: int = 0, shard_id: Any = None,
                 expert: int | None = None, source_expert: int | None = None):
        self.__dict__.update(axis=axis, source_start=source_start, size=size, dest_offset=dest_offset,
                             shard_id=shard_id, expert=expert, source_expert=source_expert)


class ModelParameter(nn.Parameter):
    """A plain (unpacked) tensor parameter with sharding metadata.

    :param output_dim: tensor dim that is split by column parallelism (None if never split)
    :param input_dim: tensor dim split by row parallelism (None if never split)
    :param shard_ids: shard ids the checkpoint must provide (``(None,)`` for a whole tensor)
    """

    def __new__(cls, data: torch.Tensor, *, output_dim: int | None = None, input_dim: int | None = None,
                shard_ids: tuple[int | None, ...] = (None,)):
        param = super().__new__(cls, data, requires_grad=False)
        param.output_dim, param.input_dim = output_dim, input_dim
        param.shard_ids = tuple(shard_ids)
        param.loaded_shards = set()
        param.is_stored = False  # True once filled through load_stored (already processed)
        return param

    def __deepcopy__(self, memo):  # nn.Parameter's version drops our attributes
        copied = type(self)(self.data.clone(), output_dim=self.output_dim, input_dim=self.input_dim,
                            shard_ids=self.shard_ids)
        copied.loaded_shards = set(self.loaded_shards)
        return copied

    def __reduce_ex__(self, protocol):
        return (_rebuild, (type(self), self.data, self.output_dim, self.input_dim, self.shard_ids))

    # ---- the four loads every parameter answers -------------------------------------------
    def load_replicated(self, loaded: Any) -> None:
        self._store_whole(loaded)
        self.loaded_shards.add(None)

    def load_column_parallel(self, loaded: Any, *, tp_rank: int, tp_size: int) -> None:
        size = self._local_size("output")
        self._load_placed(loaded, Placement("output", tp_rank * size, size))

    def load_row_parallel(self, loaded: Any, *, tp_rank: int, tp_size: int) -> None:
        size = self._local_size("input")
        self._load_placed(loaded, Placement("input", tp_rank * size, size))

    def load_merged_column(self, loaded: Any, *, shard_id: int, shard_offset: int, shard_size: int,
                           tp_rank: int) -> None:
        self._load_placed(loaded, Placement("output", tp_rank * shard_size, shard_size, shard_offset, shard_id))

    def load_qkv(self, loaded: Any, *, shard_id: int, shard_offset: int, shard_size: int, source_rank: int) -> None:
        """``source_rank`` differs from the tp rank when KV heads are replicated (tp > num_kv_heads)."""
        self._load_placed(loaded, Placement("output", source_rank * shard_size, shard_size, shard_offset, shard_id))

    def load_rows(self, loaded: Any, *, source_start: int, size: int) -> None:
        """Rows ``[source_start, source_start + size)`` into the first rows (vocab-parallel tables)."""
        self._load_placed(loaded, Placement("output", source_start, size))

    def load_expert(self, loaded: Any, placement: Placement) -> None:
        """One expert's slice of an expert parameter (``placement.expert`` set); the MoE layer
        decides the placement, the parameter how its storage holds it."""
        if placement.expert is None:
            raise ValueError("load_expert needs a placement with an expert index")
        self._load_placed(loaded, placement)

    def load_placed(self, loaded: Any, placement: Placement) -> None:
        """Any row block of the checkpoint tensor to any offset (layers whose checkpoint packs
        several parts in one tensor, in layouts the loads above do not describe)."""
        self._load_placed(loaded, placement)

    def missing_shards(self) -> set:
        return set(self.shard_ids) - self.loaded_shards

    # ---- stored state: this rank's parameter as it sits in memory --------------------------
    def stored_state(self) -> dict[str, torch.Tensor]:
        """Part name -> plain tensor; given back to ``load_stored`` they restore this parameter
        bit for bit. A plain parameter is one part, ``""``: its local (sharded) data."""
        return {"": self.data}

    def load_stored(self, loaded: Any, *, part: str = "") -> None:
        """Put back one part of a ``stored_state()`` saved from an identically built model."""
        if part != "":
            raise UnexpectedTensorError(f"a {type(self).__name__} has no stored part {part!r}")
        source = _as_tensor(loaded)
        _check_shape(self.data, source, "stored tensor")
        both_float = source.is_floating_point() and self.data.is_floating_point()
        if source.dtype != self.data.dtype and not both_float:  # never reinterpret packed integers
            raise ShapeMismatchError(f"stored tensor is {source.dtype}, the parameter holds {self.data.dtype}")
        self.data.copy_(source)
        self.mark_stored()

    def mark_stored(self) -> None:
        """Record that the parameter holds stored (already processed) state: its layer is not
        processed again, and no shard is missing. A class with several parts reports parts not yet
        received through ``missing_shards()``."""
        self.is_stored = True
        self.loaded_shards.update(self.shard_ids)

    # ---- storage hooks; packed subclasses override these ----------------------------------
    def _dim(self, axis: Axis) -> int | None:
        return self.output_dim if axis == "output" else self.input_dim

    def _local_size(self, axis: Axis) -> int:
        dim = self._dim(axis)
        return 0 if dim is None else self.data.shape[dim]

    def _load_placed(self, loaded: Any, placement: Placement) -> None:
        if placement.expert is not None:
            self._load_expert_placed(_as_tensor(loaded), placement)
            return
        dim = self._dim(placement.axis)
        if dim is None:  # not split on this axis (e.g. a row-parallel layer's bias)
            self._store_whole(loaded)
        else:
            source = _as_tensor(loaded)
            if placement.source_start + placement.size > source.shape[dim]:
                raise ShapeMismatchError(
                    f"needs {placement.axis} elements [{placement.source_start}, {placement.source_start + placement.size})"
                    f" but the checkpoint tensor has shape {tuple(source.shape)}")
            chunk = source.narrow(dim, placement.source_start, placement.size)
            target = self.data.narrow(dim, placement.dest_offset, placement.size)
            _check_shape(target, chunk, f"{placement.axis} shard {placement.shard_id}")
            copy_into(target, chunk)
        self.loaded_shards.add(placement.shard_id)

    def _load_expert_placed(self, source: torch.Tensor, placement: Placement) -> None:
        """Expert parameters are [experts, out, in] with output_dim 1 and input_dim 2."""
        if placement.source_expert is not None:
            if source.dim() != 3 or placement.source_expert >= source.shape[0]:
                raise ShapeMismatchError(f"needs expert {placement.source_expert} of a stacked [experts, out, in] "
                                         f"tensor, the checkpoint tensor has shape {tuple(source.shape)}")
            source = source.select(0, placement.source_expert)
        dim = self._dim(placement.axis) - 1  # within one expert's [out, in]
        if source.dim() != 2 or placement.source_start + placement.size > source.shape[dim]:
            raise ShapeMismatchError(
                f"needs {placement.axis} elements [{placement.source_start}, {placement.source_start + placement.size})"
                f" of one expert, the checkpoint tensor has shape {tuple(source.shape)}")
        chunk = source.narrow(dim, placement.source_start, placement.size)
        target = self.data.select(0, placement.expert).narrow(dim, placement.dest_offset, placement.size)
        _check_shape(target, chunk, f"expert {placement.expert} {placement.axis} shard")
        copy_into(target, chunk)
        self.loaded_shards.add(placement.shard_id)

    def _store_whole(self, loaded: Any) -> None:
        source = _as_tensor(loaded)
        _check_shape(self.data, source, "whole tensor")
        copy_into(self.data, source)


def _rebuild(cls, data, output_dim, input_dim, shard_ids):
    return cls(data, output_dim=output_dim, input_dim=input_dim, shard_ids=shard_ids)


def _as_tensor(loaded: Any) -> torch.Tensor:
    if not isinstance(loaded, torch.Tensor):
        raise ShapeMismatchError(f"a plain parameter got {type(loaded).__name__}, not a tensor "
                                 "(is the checkpoint quantized with a scheme that was not selected?)")
    return loaded


def _check_shape(target: torch.Tensor, source: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(source.shape):
        raise ShapeMismatchError(f"shape mismatch for {what}: model expects {tuple(target.shape)}, "
                                 f"checkpoint has {tuple(source.shape)}")


def require_divisible(value: int, by: int, what: str) -> int:
    """value // by, or a ShardingError saying which dimension cannot be split."""
    if value % by:
        raise ShardingError(f"{what} = {value} does not split evenly over {by} tensor-parallel ranks")
    return value // by
