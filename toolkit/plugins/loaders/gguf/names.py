"""GGUF tensor names -> model parameters, one table per architecture, with value transforms.

llama.cpp names tensors ``token_embd.weight``, ``blk.{i}.attn_q.weight``, ``output_norm.weight``...
A table maps each leaf to its Hugging Face module; ``split_packed`` then fuses q/k/v and gate/up
as the architecture declares. Values that llama.cpp's converter changed are changed back here,
never in a model file:

* Llama-family q/k rows are stored in an interleaved rotary order; a row permutation undoes it
  (GGUF rows are independent, so this is a permutation of packed rows: no dequantizing).
* Gemma norms are stored as ``1 + w``; the model takes ``w``.
* Norms and biases become plain tensors; every other weight stays a packed GGUFTensor.
"""
from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Mapping

import torch

from toolkit.core.errors import ShapeMismatchError
from toolkit.core.names import MappedName, NameContext, split_packed
from toolkit.core.records import FrozenRecord

from .leaves import DENSE_LEAVES, GEMMA3_LAYER_LEAVES, GLOBAL_LEAVES, IGNORED, LAYER_LEAVES  # noqa: F401
from .moe_names import EXPERT_LEAVES, MOE_LEAVES, ROUTER_LEAVES
from .tensor import GGUFTensor

_NAME = re.compile(r"^(?:blk\.(?P<layer>\d+)\.)?(?P<leaf>[A-Za-z0-9_]+)\.(?P<kind>weight|bias)$")


class GGUFNameMap(FrozenRecord):
    """The name map of one architecture.

    :param leaves: GGUF leaf -> HF module path inside ``model.layers.{i}`` (layer tensors; default LAYER_LEAVES)
    :param norm_offset: what llama.cpp added to norm weights (Gemma: 1.0)
    :param rope_interleaved: q/k rows use llama.cpp's interleaved rotary order (Llama)
    :param experts: GGUF leaf -> (stacked expert parameter inside the layer, shard id), for MoE models

    A hand-written record, not a dataclass: a GGUF load imports this module (toolkit/core/records.py
    says why).
    """

    architecture: str
    leaves: Mapping[str, str]
    norm_offset: float
    rope_interleaved: bool
    format: str
    experts: Mapping[str, tuple[str, int | None]]

    def __init__(self, architecture: str, leaves: Mapping[str, str] | None = None, norm_offset: float = 0.0,
                 rope_interleaved: bool = False, format: str = "gguf",
                 experts: Mapping[str, tuple[str, int | None]] | None = None):
        self.__dict__.update(architecture=architecture, leaves=LAYER_LEAVES if leaves is None else leaves,
                             norm_offset=norm_offset, rope_interleaved=rope_interleaved, format=format,
                             experts={} if experts is None else experts)

    def map(self, name: str, context: NameContext) -> MappedName | None:
        if name in IGNORED:
            return None
        match = _NAME.match(name)
        if match and match["layer"] is not None and match["leaf"] in self.experts:
            target, shard = self.experts[match["leaf"]]  # all experts at once, still packed
            return MappedName(f"model.layers.{match['layer']}.{target}", shard, self._transform(
                match["leaf"], match["kind"], context))
        hf = self._hf_name(match) if match else None
        if hf is None:  # the pipeline reports it as a tensor no parameter takes
            return MappedName(name)
        canonical, shard_id = split_packed(hf, context.arch.packed_modules)
        return MappedName(canonical, shard_id, self._transform(match["leaf"], match["kind"], context))

    def _hf_name(self, match: re.Match) -> str | None:
        leaf, kind, layer = match["leaf"], match["kind"], match["layer"]
        if layer is None:
            return f"{GLOBAL_LEAVES[leaf]}.{kind}" if leaf in GLOBAL_LEAVES else None
        return f"model.layers.{layer}.{self.leaves[leaf]}.{kind}" if leaf in self.leaves else None

    def _transform(self, leaf: str, kind: str, context: NameContext) -> Callable[[Any], Any] | None:
        steps: list[Callable[[Any], Any]] = []
        is_norm = leaf.endswith("norm")
        if is_norm or kind == "bias" or leaf in ROUTER_LEAVES:  # the model holds these as plain tensors
            steps.append(to_dense)
        if leaf in ROUTER_LEAVES:
            steps.append(as_matrix)
        if is_norm and self.norm_offset:
            steps.append(partial(_subtract, offset=self.norm_offset))
        if self.rope_interleaved and leaf in ("attn_q", "attn_k"):
            heads = context.config.num_heads if leaf == "attn_q" else context.config.num_kv_heads
            steps.append(partial(unpermute_rotary_rows, num_heads=heads))
        return _chain(steps) if steps else None


def to_dense(tensor: Any) -> torch.Tensor:
    return tensor.to_dense() if isinstance(tensor, GGUFTensor) else tensor


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """A one-output gate may be stored 1-D (``{n_embd}``); the model holds it as [1, hidden]."""
    return tensor.reshape(1, -1) if tensor.dim() == 1 else tensor


STORED_ATTR = "gguf_stored_values"


def _subtract(tensor: torch.Tensor, *, offset: float) -> torch.Tensor:
    """``tensor - offset`` in fp32 (before any cast to the model dtype). The stored values ride
    along as an attribute: float32 cannot always undo the shift exactly (x - 1 + 1 != x for
    stored values below 0.5, negative ones included), so a GGUF writer given this very tensor
    writes them instead."""
    stored = tensor.float()
    shifted = stored - offset
    setattr(shifted, STORED_ATTR, stored)
    return shifted


def rotary_row_order(rows: int, num_heads: int) -> torch.Tensor:
    """Source row for each model row: llama.cpp stores head h's rows as pairs (i, i + half)
    interleaved; the model wants each head's first halves, then its second halves.

    ShapeMismatchError when the rows are not whole pairs per head (a head count that does not fit)."""
    if num_heads <= 0 or rows % (2 * num_heads):
        raise ShapeMismatchError(f"{rows} rows cannot be {num_heads} heads of rotary pairs (head count wrong?)")
    return torch.arange(rows).view(num_heads, rows // num_heads // 2, 2).transpose(1, 2).reshape(-1)


def unpermute_rotary_rows(tensor: Any, *, num_heads: int) -> Any:
    """Undo llama.cpp's q/k row permutation on packed rows (GGUFTensor) or a plain tensor."""
    if isinstance(tensor, GGUFTensor) and (len(tensor.shape) != 2 or tensor.rows != tensor.shape[0]):
        raise ShapeMismatchError(f"a q/k projection must be 2-D, found shape {tensor.shape}")
    order = rotary_row_order(tensor.shape[0], num_heads)  # biases arrive here already dense
    if isinstance(tensor, GGUFTensor):
        return tensor.with_data(tensor.data.index_select(0, order))
    return tensor.index_select(0, order)


def _chain(steps: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def apply(value: Any) -> Any:
        for step in steps:
            value = step(value)
        return value

    return apply


NAME_MAPS = (
    GGUFNameMap("llama", leaves=DENSE_LEAVES["llama"], rope_interleaved=True),
    GGUFNameMap("qwen2", leaves=DENSE_LEAVES["qwen2"]),
    GGUFNameMap("qwen3", leaves=DENSE_LEAVES["qwen3"]),
    GGUFNameMap("gemma3", leaves=DENSE_LEAVES["gemma3"], norm_offset=1.0),
    GGUFNameMap("qwen2_moe", leaves={**LAYER_LEAVES, **MOE_LEAVES}, experts=EXPERT_LEAVES),
    GGUFNameMap("qwen3_moe", leaves={**LAYER_LEAVES, **MOE_LEAVES}, experts=EXPERT_LEAVES),
    GGUFNameMap("mixtral", leaves={**LAYER_LEAVES, **MOE_LEAVES}, experts=EXPERT_LEAVES, rope_interleaved=True),
)
