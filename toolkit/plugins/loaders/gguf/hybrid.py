"""GGUF ``qwen35`` and ``qwen3next`` (Gated DeltaNet hybrids): names and transforms (metadata: hybrid_config.py).

llama.cpp's converter (conversion/qwen.py) changes these models' tensors; the reader undoes
every change here, as data, and the writer redoes them, so our files match the converter's:

* names: ``linear_attn.in_proj_qkv`` -> ``attn_qkv``, ``in_proj_z`` -> ``attn_gate``,
  ``in_proj_b``/``in_proj_a`` -> ``ssm_beta``/``ssm_alpha`` (Qwen3.5), ``in_proj_ba`` -> ``ssm_ba``
  (Qwen3-Next, still interleaved per key head), ``conv1d`` -> ``ssm_conv1d``, ``A_log`` -> ``ssm_a``
  (no suffix), ``dt_bias`` -> ``ssm_dt.bias``, ``norm`` -> ``ssm_norm``, ``out_proj`` -> ``ssm_out``;
  Qwen3-Next's interleaved ``in_proj_qkvz`` is written as contiguous ``attn_qkv`` + ``attn_gate``;
* ``ssm_a = -exp(A_log)``; the conv weight is squeezed to [channels, K];
* every RMSNorm weight is stored as ``1 + w`` except the GDN's gated ``ssm_norm``;
* Qwen3.5 with fewer key than value heads: value heads are reordered from grouped (by key
  head) to tiled order in every tensor indexed by value head (the v rows of ``attn_qkv`` and of
  the conv, ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, ``ssm_a``, ``ssm_dt`` and the columns of
  ``ssm_out``). Rows permute as packed rows; columns permute as whole quant blocks when a head
  spans whole blocks, else the tensor is dequantized (to F32) first.

Why ``ssm_out`` under a K-quant loads as F32 (Qwen3.5 / Qwen3.5-MoE with fewer key than value
heads only): its columns are value heads, and a K-quant block (256 columns) is wider than a
value head (128 in the released models). In llama.cpp's tiled order one block holds value ``i``
of two neighbouring key groups, which grouped order puts ``ratio * 128`` columns apart, so no
move of whole blocks (or bytes) gives the grouped columns: it is not a width constraint a block
size change can lift. Exact alternatives would keep the file's column order and permute the
activation entering ``out_proj`` instead, which would follow the file's layout into the layer
and does not split by heads under tensor parallelism (a rank's columns are not its heads in
tiled order). Q8_0 / Q4_0 / Q5_x (32-column blocks) keep it packed; so does every Qwen3-Next
file (its converter does not reorder). Cost at Qwen3.5-35B-A3B's shape (30 GDN layers of
[2048, 4096]): about 1.0 GB in F32 instead of about 0.14 GB in Q4_K.

Layer kinds come from ``{arch}.attention.recurrent_layers`` (else ``full_attention_interval``).

Mixture of experts (``qwen3next`` as llama.cpp knows it, ``qwen35moe``): the MoE tables of
moe_names.py, unchanged: stacked ``ffn_{gate,up,down}_exps`` (kept packed), the router
``ffn_gate_inp`` and the shared expert ``ffn_*_shexp`` with its gate ``ffn_gate_inp_shexp``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from toolkit.core.config import ModelConfig
from toolkit.core.errors import ConversionError
from toolkit.core.names import MappedName, NameContext, split_packed

from .hybrid_config import LINEAR
from .moe_names import EXPERT_LEAVES, MOE_LEAVES, ROUTER_LEAVES
from .names import GLOBAL_LEAVES, LAYER_LEAVES, IGNORED, GGUFNameMap, as_matrix, to_dense
from .tensor import GGUFTensor
from .writer_names import expert_leaves

QWEN35_MROPE_SECTIONS = [11, 11, 10, 0]  # what the converter writes when the config has none

_COMMON = {**{k: v for k, v in LAYER_LEAVES.items() if k != "ffn_norm"},
           "post_attention_norm": "post_attention_layernorm",
           "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
           "ssm_conv1d": "linear_attn.conv1d", "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj"}
QWEN35_LEAVES = {**_COMMON, "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a"}
QWEN3NEXT_LEAVES = {**_COMMON, **MOE_LEAVES, "ssm_ba": "linear_attn.in_proj_ba"}
QWEN35MOE_LEAVES = {**QWEN35_LEAVES, **MOE_LEAVES}
# GGUF (leaf, kind) -> HF parameter inside the layer, for the two that are not "<module>.<kind>"
SPECIAL = {("ssm_a", None): "linear_attn.A_log", ("ssm_dt", "bias"): "linear_attn.dt_bias"}
SPECIAL_INVERSE = {hf: leaf for leaf, hf in SPECIAL.items()}
DENSE_LEAVES = ("ssm_conv1d", "ssm_a", "ssm_dt")
SKIPPED_HF = ("mtp.", "model.mtp.", "model.visual.", "visual.")

_NAME = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<leaf>[A-Za-z0-9_]+)(?:\.(?P<kind>weight|bias))?$")
_HF = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<path>.+?)(?:\.(?P<kind>weight|bias))?$")


# ---- value-head order ------------------------------------------------------------------------
def grouped_from_tiled(num_k_heads: int, num_v_heads: int, head_dim: int) -> torch.Tensor:
    """For each position in grouped order (key head, its value head, element), the tiled position
    llama.cpp stores it at (value head within group, key head, element)."""
    ratio = num_v_heads // num_k_heads
    return torch.arange(num_v_heads * head_dim).view(ratio, num_k_heads, head_dim).transpose(0, 1).reshape(-1)


def _with_prefix(order: torch.Tensor, prefix: int) -> torch.Tensor:
    return torch.cat((torch.arange(prefix), order + prefix))


def _take_rows(tensor: Any, order: torch.Tensor) -> Any:
    if isinstance(tensor, GGUFTensor):
        return tensor.with_data(tensor.data.index_select(0, order))
    return tensor.index_select(0, order)


def _take_columns(tensor: Any, order: torch.Tensor, head_dim: int) -> Any:
    """Columns in ``order``; packed data moves as whole blocks when a head spans whole blocks."""
    if not isinstance(tensor, GGUFTensor):
        return tensor.index_select(-1, order)
    block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.qtype)]
    if head_dim % block == 0:
        heads = order.view(-1, head_dim)[:, 0] // head_dim  # whole heads move
        per_head = head_dim // block * type_bytes
        data = tensor.data.view(tensor.rows, -1, per_head).index_select(1, heads).reshape(tensor.rows, -1)
        return tensor.with_data(data)
    dense = tensor.to_dense(torch.float32).index_select(-1, order).contiguous()
    return GGUFTensor(tensor.name, int(GGMLQuantizationType.F32), tensor.shape,
                      dense.view(torch.uint8).reshape(tensor.rows, -1))


@dataclass(frozen=True)
class _Dims:
    kh: int
    nv: int
    dk: int
    dv: int

    @classmethod
    def of(cls, config: ModelConfig) -> "_Dims":
        return cls(config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                   config.linear_value_head_dim)

    def order(self, leaf: str) -> tuple[str, torch.Tensor] | None:
        """(axis, grouped-from-tiled order) of a value-head-indexed tensor, None for the others."""
        if leaf in ("attn_qkv", "ssm_conv1d"):
            return "rows", _with_prefix(grouped_from_tiled(self.kh, self.nv, self.dv), 2 * self.kh * self.dk)
        if leaf == "attn_gate":
            return "rows", grouped_from_tiled(self.kh, self.nv, self.dv)
        if leaf in ("ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt"):
            return "rows", grouped_from_tiled(self.kh, self.nv, 1)
        if leaf == "ssm_out":
            return "columns", grouped_from_tiled(self.kh, self.nv, self.dv)
        return None


# ---- reading -----------------------------------------------------------------------------------
class HybridGGUFNames(GGUFNameMap):
    """The reader's map for ``qwen35`` / ``qwen3next`` (see the module docstring). Like its base, a
    hand-written record (toolkit/core/records.py); ``leaves`` defaults to QWEN35_LEAVES, ``norm_offset``
    to 1.0."""

    tiled_values: bool  # Qwen3.5's converter reorders value heads; Qwen3-Next's does not

    def __init__(self, architecture: str, leaves: Mapping[str, str] | None = None, norm_offset: float = 1.0,
                 rope_interleaved: bool = False, format: str = "gguf",
                 experts: Mapping[str, tuple[str, int | None]] | None = None, tiled_values: bool = True):
        super().__init__(architecture, QWEN35_LEAVES if leaves is None else leaves, norm_offset, rope_interleaved,
                         format, experts)
        self.__dict__["tiled_values"] = tiled_values

    def namer(self, config: ModelConfig, gguf_arch: str, packed_modules=None) -> "HybridGGUFNamer":
        return HybridGGUFNamer(self, config, gguf_arch, packed_modules or {})

    def map(self, name: str, context: NameContext) -> MappedName | None:
        if name in IGNORED:
            return None
        match = _NAME.match(name)
        if not match:
            return MappedName(name)
        leaf, kind, layer = match["leaf"], match["kind"], match["layer"]
        if layer is not None and leaf in self.experts:  # all experts at once, still packed
            target, shard = self.experts[leaf]
            return MappedName(f"model.layers.{layer}.{target}", shard)
        if layer is None:
            hf = f"{GLOBAL_LEAVES[leaf]}.{kind}" if leaf in GLOBAL_LEAVES and kind else None
        elif (leaf, kind) in SPECIAL:
            hf = f"model.layers.{layer}.{SPECIAL[(leaf, kind)]}"
        else:
            hf = f"model.layers.{layer}.{self.leaves[leaf]}.{kind}" if leaf in self.leaves and kind else None
        if hf is None:
            return MappedName(name)
        canonical, shard_id = split_packed(hf, context.arch.packed_modules)
        return MappedName(canonical, shard_id, self._steps(leaf, context.config))

    def _steps(self, leaf: str, config: ModelConfig) -> Callable[[Any], Any] | None:
        steps: list[Callable[[Any], Any]] = []
        if leaf.endswith("norm") or leaf in DENSE_LEAVES or leaf in ROUTER_LEAVES:
            steps.append(to_dense)
        if leaf in ROUTER_LEAVES:
            steps.append(as_matrix)
        if leaf.endswith("norm") and leaf != "ssm_norm":
            steps.append(lambda t: t.float() - self.norm_offset)
        dims = _Dims.of(config)
        reorder = dims.order(leaf) if self.tiled_values and dims.kh != dims.nv else None
        if reorder is not None:
            axis, order = reorder
            steps.append(partial(_take_rows, order=order) if axis == "rows"
                         else partial(_take_columns, order=order, head_dim=dims.dv))
        if leaf == "ssm_a":
            steps.append(lambda t: torch.log(-t.float()))
        if leaf == "ssm_conv1d":
            steps.append(lambda t: t.unsqueeze(1))
        return _chain(steps) if steps else None


def _chain(steps):
    def apply(value):
        for step in steps:
            value = step(value)
        return value

    return apply


# ---- writing -----------------------------------------------------------------------------------
class HybridGGUFNamer:
    """HF names and values -> llama.cpp's (the inverse of ``HybridGGUFNames``)."""

    def __init__(self, name_map: HybridGGUFNames, config: ModelConfig, gguf_arch: str, packed_modules):
        self.name_map, self.config, self.gguf_arch = name_map, config, gguf_arch
        self.expert_leaves = expert_leaves(name_map, packed_modules)  # mlp.experts.gate_proj -> ffn_gate_exps
        self.layer_leaves = {hf: leaf for leaf, hf in name_map.leaves.items()}
        self.globals = {hf: leaf for leaf, hf in GLOBAL_LEAVES.items()}
        self.dims = _Dims.of(config)

    def to_files(self, hf_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if hf_name.startswith(SKIPPED_HF):
            return []
        match = _HF.match(hf_name)
        if match is None:
            module, _, kind = hf_name.rpartition(".")
            if module not in self.globals:
                raise ConversionError(f"tensor {hf_name!r} has no GGUF name for {self.gguf_arch!r}")
            leaf, name = self.globals[module], f"{self.globals[module]}.{kind}"
            return [(name, tensor.float() + self.name_map.norm_offset if leaf.endswith("norm") else tensor)]
        layer, path, kind = match["layer"], match["path"], match["kind"]
        if path == "linear_attn.in_proj_qkvz":  # Qwen3-Next: per-key-head interleaved -> contiguous qkv + z
            qkv, z = self._split_qkvz(tensor)
            return [(f"blk.{layer}.attn_qkv.weight", qkv), (f"blk.{layer}.attn_gate.weight", z)]
        if kind is None and path in self.expert_leaves:  # stacked experts: no .weight in the driver's name
            return [(f"blk.{layer}.{self.expert_leaves[path]}.weight", tensor)]
        if kind is None and path in SPECIAL_INVERSE:  # A_log, dt_bias: no .weight in the HF name
            leaf, gguf_kind = SPECIAL_INVERSE[path]
            name = f"blk.{layer}.{leaf}" + (f".{gguf_kind}" if gguf_kind else "")
        elif kind is not None and path in self.layer_leaves:
            leaf = self.layer_leaves[path]
            name = f"blk.{layer}.{leaf}.{kind}"
        else:
            raise ConversionError(f"tensor {hf_name!r} has no GGUF name for {self.gguf_arch!r}")
        return [(name, self._value(leaf, tensor))]

    def _value(self, leaf: str, tensor: torch.Tensor) -> torch.Tensor:
        if leaf.endswith("norm") and leaf != "ssm_norm":
            tensor = tensor.float() + self.name_map.norm_offset
        if leaf == "ssm_a":
            tensor = -torch.exp(tensor.float())
        if leaf == "ssm_conv1d":
            tensor = tensor.squeeze(1)
        reorder = self.dims.order(leaf) if self.name_map.tiled_values and self.dims.kh != self.dims.nv else None
        if reorder is not None:  # grouped -> tiled: the inverse of the reader's order
            axis, order = reorder
            inverse = torch.argsort(order).to(tensor.device)  # tensors may be written from the GPU
            tensor = tensor.index_select(0 if axis == "rows" else -1, inverse)
        return tensor

    def _split_qkvz(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.dims
        per_head = tensor.view(d.kh, -1, tensor.shape[-1])
        r = d.nv // d.kh
        q, k, v, z = per_head.split([d.dk, d.dk, r * d.dv, r * d.dv], dim=1)
        flat = [t.reshape(-1, tensor.shape[-1]) for t in (q, k, v, z)]
        return torch.cat(flat[:3]), flat[3]

    def extra_entries(self) -> list[tuple[str, Any, GGUFValueType]]:
        """Metadata the converter writes that no table row carries."""
        config, arch = self.config, self.gguf_arch
        recurrent = [kind == LINEAR for kind in config.layer_types]
        entries = [(f"{arch}.attention.recurrent_layers", recurrent, GGUFValueType.ARRAY),
                   (f"{arch}.ssm.inner_size", config.linear_num_value_heads * config.linear_value_head_dim,
                    GGUFValueType.UINT32),
                   (f"{arch}.rope.dimension_count", int(config.head_dim * config.partial_rotary_factor),
                    GGUFValueType.UINT32),
                   (f"{arch}.full_attention_interval", int(config.raw.get("full_attention_interval", 4)),
                    GGUFValueType.UINT32)]
        if arch in ("qwen35", "qwen35moe"):  # llama.cpp requires them for both
            sections = (config.raw.get("rope_parameters") or {}).get("mrope_section") or QWEN35_MROPE_SECTIONS
            entries.append((f"{arch}.rope.dimension_sections", list(sections) + [0] * (4 - len(sections)),
                            GGUFValueType.ARRAY))
        return entries


# Registered as Deferred entries by the package (its __init__), under these attribute names
QWEN35_NAMES = HybridGGUFNames("qwen3_5", leaves=QWEN35_LEAVES, tiled_values=True)
QWEN3NEXT_NAMES = HybridGGUFNames("qwen3_next", leaves=QWEN3NEXT_LEAVES, tiled_values=False, experts=EXPERT_LEAVES)
QWEN35MOE_NAMES = HybridGGUFNames("qwen3_5_moe", leaves=QWEN35MOE_LEAVES, tiled_values=True, experts=EXPERT_LEAVES)
