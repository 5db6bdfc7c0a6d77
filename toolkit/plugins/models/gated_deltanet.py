"""Gated DeltaNet (GDN): the linear-attention token mixer of Qwen3-Next and Qwen3.5.

One fused input projection yields, per rank, ``[q | k | v | z | b | a]`` (q/k: key heads x
``dk``; v/z: value heads x ``dv``; b/a: one per value head). q, k, v go through a causal
depthwise conv (SiLU), then the gated delta rule with ``beta = sigmoid(b)`` and decay
``g = -exp(A_log) * softplus(a + dt_bias)``; the result is normed per value head by a gated
RMSNorm (plain ``w``, gate ``silu(z)``) and projected out. Per sequence the layer keeps a conv
window [channels, K - 1] and a recurrent state [value heads, dk, dv] (float32) in a
``RecurrentState``: constant size whatever the sequence length.

Checkpoints store the projection in several layouts; all fill the same fused parameter. The
checkpoint member (its index in ``IN_PROJ_MEMBERS``, the shard id name maps give) says which:

* ``in_proj_qkv`` (q, k, v contiguous), ``in_proj_z``, ``in_proj_b``, ``in_proj_a`` (Qwen3.5);
* ``in_proj_qkvz`` / ``in_proj_ba`` (Qwen3-Next): interleaved per key head,
  ``[q_h, k_h, v_h..., z_h...]`` and ``[b_h..., a_h...]`` with ``HV / HK`` value heads per key head.

Value heads are in grouped order (value head ``j`` belongs to key head ``j // (HV / HK)``), so
tensor parallelism splits every part evenly by heads: rank ``r`` holds its key heads together
with their value heads, and the conv channels, ``A_log`` and ``dt_bias`` follow.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.config import ModelConfig
from toolkit.core.errors import ShardingError
from toolkit.core.layers import AttentionMetadata, RecurrentState, RowParallelLinear
from toolkit.core.layers.linear import LinearBase
from toolkit.core.params import ModelParameter, Placement, require_divisible
from toolkit.kernels import runtime

PARTS = ("q", "k", "v", "z", "b", "a")
IN_PROJ_MEMBERS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba")
CHUNK_SIZE = 64


@dataclass(frozen=True)
class GDNDims:
    """Full (unsharded) sizes of one Gated DeltaNet layer."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @classmethod
    def of(cls, config: ModelConfig) -> "GDNDims":
        return cls(config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                   config.linear_value_head_dim, config.linear_conv_kernel_dim)

    @property
    def ratio(self) -> int:
        return self.num_v_heads // self.num_k_heads

    def part_sizes(self) -> list[int]:
        kd, vd = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        return [kd, kd, vd, vd, self.num_v_heads, self.num_v_heads]

    def member_blocks(self, member: int) -> list[tuple[int, int, int]]:
        """The checkpoint member's rows in order, as (part, first row within the part, rows)."""
        dk, dv, r, kh = self.head_k_dim, self.head_v_dim, self.ratio, self.num_k_heads
        sizes = self.part_sizes()
        if member == 0:
            return [(0, 0, sizes[0]), (1, 0, sizes[1]), (2, 0, sizes[2])]
        if member in (1, 2, 3):
            return [(member + 2, 0, sizes[member + 2])]
        if member == 4:
            return [block for h in range(kh) for block in
                    ((0, h * dk, dk), (1, h * dk, dk), (2, h * r * dv, r * dv), (3, h * r * dv, r * dv))]
        if member == 5:
            return [block for h in range(kh) for block in ((4, h * r, r), (5, h * r, r))]
        raise ValueError(f"unknown Gated DeltaNet projection member {member} (members: {IN_PROJ_MEMBERS})")


def rank_placements(blocks: list[tuple[int, int, int]], part_sizes: list[int], tp_rank: int, tp_size: int
                    ) -> list[Placement]:
    """Placements that copy this rank's rows of each part out of a checkpoint tensor laid out as
    ``blocks``; parts are concatenated in the parameter, each split evenly over ranks."""
    local = [size // tp_size for size in part_sizes]
    offsets = [sum(local[:i]) for i in range(len(local))]
    placements, source = [], 0
    for part, first, rows in blocks:
        lo, hi = max(first, tp_rank * local[part]), min(first + rows, (tp_rank + 1) * local[part])
        if lo < hi:
            placements.append(Placement("output", source + lo - first, hi - lo,
                                        offsets[part] + lo - tp_rank * local[part], PARTS[part]))
        source += rows
    return placements


def check_heads(dims: GDNDims, tp_size: int, prefix: str) -> None:
    if dims.num_v_heads % dims.num_k_heads:
        raise ShardingError(f"{prefix}: {dims.num_v_heads} value heads are not a multiple of "
                            f"{dims.num_k_heads} key heads")
    require_divisible(dims.num_k_heads, tp_size, f"{prefix} linear-attention key heads")


class GDNInProj(LinearBase):
    """The fused ``[q|k|v|z|b|a]`` projection; shard id = checkpoint member index (see module doc)."""

    def __init__(self, hidden_size: int, dims: GDNDims, *, quant, parallel, prefix: str):
        check_heads(dims, parallel.tp_size, prefix)
        self.dims = dims
        sizes = dims.part_sizes()
        super().__init__(hidden_size, sizes, quant=quant, parallel=parallel, prefix=prefix,
                         input_size_per_partition=hidden_size,
                         output_partition_sizes=[size // parallel.tp_size for size in sizes], bias=False)

    def _shard_ids(self) -> tuple:
        return PARTS

    def load_weight(self, param_name: str, loaded, shard_id) -> None:
        if not isinstance(shard_id, int):
            raise ValueError(f"{self.prefix}.{param_name} is fused; a member index of {IN_PROJ_MEMBERS} is required")
        param = getattr(self, param_name)
        for placement in rank_placements(self.dims.member_blocks(shard_id), self.dims.part_sizes(),
                                         self.parallel.tp_rank, self.parallel.tp_size):
            param.load_placed(loaded, placement)


class GDNConv(nn.Module):
    """Depthwise conv weight [channels, 1, K] over the q, k, v channels (split like the projection)."""

    def __init__(self, dims: GDNDims, *, parallel, dtype: torch.dtype):
        super().__init__()
        self.dims, self.parallel = dims, parallel
        self.channels = sum(dims.part_sizes()[:3]) // parallel.tp_size
        self.weight = ModelParameter(torch.zeros(self.channels, 1, dims.conv_kernel, dtype=dtype), output_dim=0,
                                     shard_ids=PARTS[:3])

    def load_weight(self, param_name: str, loaded, shard_id) -> None:
        for placement in rank_placements(self.dims.member_blocks(0), self.dims.part_sizes(),
                                         self.parallel.tp_rank, self.parallel.tp_size):
            self.weight.load_placed(loaded, placement)


class GatedRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = ModelParameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return runtime.call("gated_rms_norm", x, gate, self.weight, self.eps)

    def load_weight(self, param_name: str, loaded, shard_id) -> None:
        self.weight.load_replicated(loaded)


class GatedDeltaNet(nn.Module):
    """``forward(hidden [T, hidden], attn) -> [T, hidden]`` over the flat varlen batch."""

    def __init__(self, config: ModelConfig, *, quant, parallel, prefix: str):
        super().__init__()
        dims = self.dims = GDNDims.of(config)
        tp, dtype = parallel.tp_size, quant.params_dtype
        self.in_proj = GDNInProj(config.hidden_size, dims, quant=quant, parallel=parallel, prefix=f"{prefix}.in_proj")
        self.conv1d = GDNConv(dims, parallel=parallel, dtype=dtype)
        self.k_heads, self.v_heads = dims.num_k_heads // tp, dims.num_v_heads // tp
        self.A_log = ModelParameter(torch.zeros(self.v_heads, dtype=dtype), output_dim=0)
        self.dt_bias = ModelParameter(torch.zeros(self.v_heads, dtype=dtype), output_dim=0)
        self.norm = GatedRMSNorm(dims.head_v_dim, config.rms_norm_eps, dtype)
        self.out_proj = RowParallelLinear(dims.num_v_heads * dims.head_v_dim, config.hidden_size, quant=quant,
                                          parallel=parallel, prefix=f"{prefix}.out_proj")
        self.parallel = parallel
        self.state = RecurrentState({
            "conv": ((self.conv1d.channels, dims.conv_kernel - 1), None),
            "ssm": ((self.v_heads, dims.head_k_dim, dims.head_v_dim), torch.float32)})

    def load_weight(self, param_name: str, loaded, shard_id) -> None:  # A_log, dt_bias
        getattr(self, param_name).load_column_parallel(loaded, tp_rank=self.parallel.tp_rank,
                                                       tp_size=self.parallel.tp_size)

    def int8_input(self, tokens: int):
        """What the block reads of its input (the input projection's need; ``kernels/int8_blocks.py``)."""
        return self.in_proj.int8_input(tokens)

    def forward(self, hidden: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        tokens, dims = hidden.shape[0], self.dims
        sizes = self.in_proj.output_partition_sizes
        channels = self.conv1d.channels
        projected = self.in_proj(hidden)
        mixed, z, b, a = projected.split([channels, sizes[3], sizes[4], sizes[5]], dim=-1)
        conv_state, ssm_state = self.state.get("conv"), self.state.get("ssm")
        slots = attn.state_slots if conv_state is not None else None
        fresh = attn.starts_fresh()
        weight = self.conv1d.weight.squeeze(1)
        decode = attn.is_decode and slots is not None
        if decode:
            mixed = runtime.call("causal_conv1d_decode", mixed, weight, None, conv_state, slots, fresh)
        else:
            mixed = runtime.call("causal_conv1d_prefill", mixed, weight, None, conv_state, attn.query_start_loc,
                                 slots, fresh)
        q, k, v = mixed.split(sizes[:3], dim=-1)
        q = q.reshape(tokens, self.k_heads, dims.head_k_dim)
        k = k.reshape(tokens, self.k_heads, dims.head_k_dim)
        v = v.reshape(tokens, self.v_heads, dims.head_v_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        if decode:
            out = runtime.call("gated_delta_rule_decode", q, k, v, g, beta, ssm_state, slots, fresh)
        else:
            out = runtime.call("gated_delta_rule_prefill", q, k, v, g, beta, ssm_state, attn.query_start_loc,
                               slots, fresh, CHUNK_SIZE)
        out = self.norm(out.reshape(-1, dims.head_v_dim), z.reshape(-1, dims.head_v_dim))
        return self.out_proj(out.reshape(tokens, -1))
