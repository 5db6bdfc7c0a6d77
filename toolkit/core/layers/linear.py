"""Parallel linear layers (vLLM's layout). Each decides which slice of a checkpoint tensor its
rank owns and hands that to the parameter; the quant scheme owns the parameters and the matmul.
"""
from __future__ import annotations

import torch
from torch import nn

from ...kernels.int8_blocks import scheme_request
from ...kernels.split_sums import Columns, SplitSums, split_columns
from ..params import ModelParameter, require_divisible
from ..parallel import ParallelContext
from ..quant import QuantScheme


class LinearBase(nn.Module):
    """Creates weights through the scheme; ``forward`` is ``scheme.apply``."""

    layer_kind = "linear"

    def __init__(self, input_size: int, output_sizes: list[int], *, quant: QuantScheme, parallel: ParallelContext,
                 prefix: str, input_size_per_partition: int, output_partition_sizes: list[int], bias: bool):
        super().__init__()
        self.input_size, self.output_size = input_size, sum(output_sizes)
        self.output_sizes, self.output_partition_sizes = output_sizes, output_partition_sizes
        self.input_size_per_partition = input_size_per_partition
        self.parallel, self.prefix = parallel, prefix
        self.shard_ids = self._shard_ids()  # what the checkpoint must provide for each weight
        self.scheme = quant.scheme_for(layer_kind=self.layer_kind, prefix=prefix)
        self.scheme.create_weights(self, input_size_per_partition=input_size_per_partition,
                                   output_partition_sizes=output_partition_sizes, input_size=input_size,
                                   output_size=self.output_size)
        self.bias = ModelParameter(torch.zeros(sum(output_partition_sizes), dtype=self.scheme.params_dtype),
                                   output_dim=0, shard_ids=self.shard_ids) if bias else None

    def _shard_ids(self) -> tuple:
        return (None,)

    def forward(self, x: torch.Tensor, unreduced: bool = False) -> torch.Tensor | SplitSums:
        """``x @ W.T (+ bias)`` through the scheme. ``unreduced``: the caller's next op adds split-K partial sums
        itself (``kernels/split_sums.py``), so a scheme with ``apply_unreduced`` may return them instead."""
        if unreduced and self.bias is None and hasattr(self.scheme, "apply_unreduced"):
            return self.scheme.apply_unreduced(self, x)
        return self.scheme.apply(self, x, self.bias)

    def int8_input(self, tokens: int):
        """What the scheme's matmul reads for ``tokens`` rows besides x: ``Int8Input`` (int8 blocks its
        producer may write, ``kernels/int8_blocks.py``) or None. Asked once per token count (after loading)."""
        return scheme_request(self, "int8_input", tokens)

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        raise NotImplementedError


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, *, quant, parallel, prefix: str, bias: bool = False):
        super().__init__(input_size, [output_size], quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=input_size, output_partition_sizes=[output_size], bias=bias)

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        getattr(self, param_name).load_replicated(loaded)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; ``gather_output`` concatenates them again."""

    def __init__(self, input_size: int, output_size: int, *, quant, parallel: ParallelContext, prefix: str,
                 bias: bool = False, gather_output: bool = False):
        per_rank = require_divisible(output_size, parallel.tp_size, f"{prefix} output features")
        self.gather_output = gather_output
        super().__init__(input_size, [output_size], quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=input_size, output_partition_sizes=[per_rank], bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return self.parallel.all_gather(y) if self.gather_output else y

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        getattr(self, param_name).load_column_parallel(loaded, tp_rank=self.parallel.tp_rank,
                                                       tp_size=self.parallel.tp_size)


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel outputs fused into one matmul (gate_up_proj); shard id = position."""

    def __init__(self, input_size: int, output_sizes: list[int], *, quant, parallel: ParallelContext, prefix: str,
                 bias: bool = False):
        parts = [require_divisible(size, parallel.tp_size, f"{prefix} output {i}") for i, size in enumerate(output_sizes)]
        super().__init__(input_size, output_sizes, quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=input_size, output_partition_sizes=parts, bias=bias)

    def _shard_ids(self) -> tuple:
        return tuple(range(len(self.output_sizes)))

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        if shard_id is None:
            raise ValueError(f"{self.prefix}.{param_name} is fused; a shard id is required")
        offset = sum(self.output_partition_sizes[:shard_id])
        getattr(self, param_name).load_merged_column(loaded, shard_id=shard_id, shard_offset=offset,
                                                     shard_size=self.output_partition_sizes[shard_id],
                                                     tp_rank=self.parallel.tp_rank)


class QKVParallelLinear(LinearBase):
    """q, k, v projections fused; KV heads are replicated when tp_size > num_kv_heads."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, *, quant,
                 parallel: ParallelContext, prefix: str, bias: bool = False):
        tp = parallel.tp_size
        self.head_dim = head_dim
        self.num_heads = require_divisible(num_heads, tp, f"{prefix} attention heads")
        if tp >= num_kv_heads:
            require_divisible(tp, num_kv_heads, f"{prefix} tp size over KV heads")
            self.num_kv_heads, self.num_kv_replicas = 1, tp // num_kv_heads
        else:
            self.num_kv_heads = require_divisible(num_kv_heads, tp, f"{prefix} KV heads")
            self.num_kv_replicas = 1
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        parts = [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * head_dim]
        super().__init__(hidden_size, sizes, quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=hidden_size, output_partition_sizes=parts, bias=bias)

    def _shard_ids(self) -> tuple:
        return (0, 1, 2)

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        if shard_id not in (0, 1, 2):
            raise ValueError(f"{self.prefix}.{param_name} needs shard id 0 (q), 1 (k) or 2 (v), got {shard_id}")
        rank = self.parallel.tp_rank
        source_rank = rank if shard_id == 0 else rank // self.num_kv_replicas
        getattr(self, param_name).load_qkv(loaded, shard_id=shard_id,
                                           shard_offset=sum(self.output_partition_sizes[:shard_id]),
                                           shard_size=self.output_partition_sizes[shard_id], source_rank=source_rank)

    def split(self, qkv: torch.Tensor | SplitSums | Columns) -> tuple:
        """``(q, k, v)`` of the fused output; of split-K partial sums, each part's partials (``split_columns``)."""
        return split_columns(qkv, self.output_partition_sizes)


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial results are summed across ranks."""

    def __init__(self, input_size: int, output_size: int, *, quant, parallel: ParallelContext, prefix: str,
                 bias: bool = False, reduce_results: bool = True):
        per_rank = require_divisible(input_size, parallel.tp_size, f"{prefix} input features")
        self.reduce_results = reduce_results
        super().__init__(input_size, [output_size], quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=per_rank, output_partition_sizes=[output_size], bias=bias)

    def forward(self, x: torch.Tensor, unreduced: bool = False) -> torch.Tensor | SplitSums:
        if unreduced and self.bias is None and not (self.reduce_results and self.parallel.tp_size > 1):
            return super().forward(x, unreduced=True)
        y = self.scheme.apply(self, x, None)  # bias after the reduction, so it is added once
        if self.reduce_results:
            y = self.parallel.all_reduce(y)
        return y if self.bias is None else y + self.bias

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        getattr(self, param_name).load_row_parallel(loaded, tp_rank=self.parallel.tp_rank,
                                                    tp_size=self.parallel.tp_size)
