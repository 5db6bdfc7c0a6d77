"""Attention over a paged KV cache, and the metadata every model forward receives.

The model forward signature is ``forward(input_ids [T], positions [T], attn: AttentionMetadata)``
with the tokens of all sequences in the batch flattened (varlen). The batching engine fills
the metadata and binds each Attention layer's ``k_cache``/``v_cache``
([num_blocks, block_size, num_kv_heads, head_dim]); with no cache bound (``slot_mapping`` None)
each sequence attends causally over its own new tokens only, which is what ``logits()`` needs.
"""
from __future__ import annotations

import torch
from torch import nn

from ...kernels import runtime
from ...kernels.int8_blocks import attach, requested
from ...kernels.split_sums import SplitSums, reduced
from ..records import Record
from .rotary import RotaryEmbedding


class AttentionMetadata(Record):
    """Where each sequence's new tokens sit in the flat batch and where its KV lives.

    :param query_start_loc: [num_seqs + 1] offsets of each sequence's new tokens in the batch
    :param seq_lens: [num_seqs] tokens of context per sequence after this step (cached + new)
    :param slot_mapping: [T] KV-cache slot (block * block_size + offset) for each new token, or None
    :param block_tables: [num_seqs, max_blocks] KV block ids per sequence (-1 padded), or None
    :param state_slots: [num_seqs] row of each sequence in the bound recurrent states, or None
        (recurrent layers then start every sequence from zero and keep nothing)

    A hand-written record, not a dataclass: a load imports this module (records.py says why).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor | None
    block_tables: torch.Tensor | None
    max_query_len: int
    max_seq_len: int
    state_slots: torch.Tensor | None

    def __init__(self, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, slot_mapping: torch.Tensor | None = None,
                 block_tables: torch.Tensor | None = None, max_query_len: int = 0, max_seq_len: int = 0,
                 state_slots: torch.Tensor | None = None):
        self.query_start_loc = query_start_loc
        self.seq_lens = seq_lens
        self.slot_mapping = slot_mapping
        self.block_tables = block_tables
        self.max_query_len = max_query_len
        self.max_seq_len = max_seq_len
        self.state_slots = state_slots

    @classmethod
    def for_prompts(cls, lengths: list[int], device: torch.device | str = "cpu") -> "AttentionMetadata":
        """Uncached causal attention over whole sequences of these lengths (no KV cache)."""
        starts = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
        lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        return cls(starts, lens, max_query_len=max(lengths), max_seq_len=max(lengths))

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1

    def starts_fresh(self) -> torch.Tensor:
        """[num_seqs] bool: the sequence has no earlier tokens, so its recurrent state starts at zero
        (padding rows of a captured graph, with context length 0, count as fresh too)."""
        query_lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return self.seq_lens - query_lens <= 0


class Attention(nn.Module):
    """Stores new K/V into the cache (if bound) and runs the ``paged_attention`` op.

    Given a ``rotary`` embedding (and the tokens' ``positions``), it rotates q and k first: with a
    cache bound, in the op that also stores k and v (``rotary_store_kv``), else with ``rotary_qk``.
    Per-head q/k norms given as ``qk_norm`` run before the rotation, with a cache bound in that same op
    (``qk_norm_rotary_store_kv``); anything else that must happen to q and k happens before the call.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, *, scale: float,
                 sliding_window: int | None = None, logit_softcap: float | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.sliding_window, self.logit_softcap = scale, sliding_window, logit_softcap
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor | SplitSums, k: torch.Tensor | SplitSums, v: torch.Tensor | SplitSums,
                attn: AttentionMetadata, *, rotary: RotaryEmbedding | None = None,
                positions: torch.Tensor | None = None, qk_norm: tuple[nn.Module, nn.Module] | None = None,
                feeds=None) -> torch.Tensor:
        """q: [T, heads * head_dim], k and v: [T, kv_heads * head_dim]; returns [T, heads * head_dim].
        ``qk_norm``: (q_norm, k_norm) RMSNorms over each head's features, applied before the rotation.
        q, k and v may be a projection's split-K partial sums (``kernels/split_sums.py``). ``feeds``: the module
        the output goes to (the output projection): where it reads int8 blocks, the attention kernel may write
        them with the output (``kernels/int8_blocks.py``)."""
        tokens = q.shape[0]
        cached = attn.slot_mapping is not None and self.k_cache is not None
        fused_store = cached and rotary is not None  # one op rotates, applies the q/k norms, adds split sums, stores
        if not fused_store:
            q, k, v = reduced(q), reduced(k), reduced(v)
        if qk_norm is not None and not fused_store:
            q = qk_norm[0](q.reshape(tokens, -1, self.head_dim)).reshape(tokens, -1)
            k = qk_norm[1](k.reshape(tokens, -1, self.head_dim)).reshape(tokens, -1)
            qk_norm = None
        if cached:
            if rotary is not None:
                q = rotary.forward_store(positions, q, k, v, self.k_cache, self.v_cache, attn.slot_mapping,
                                         qk_norm=qk_norm)
            else:
                runtime.call("store_kv", self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads),
                             self.k_cache, self.v_cache, attn.slot_mapping)
            request = requested(feeds, tokens)
            if request is not None:
                out, *blocks = runtime.call("paged_attention_int8", self._heads(q, self.num_heads), self.k_cache,
                                            self.v_cache, attn, self.scale, self.sliding_window, self.logit_softcap,
                                            request.sums)
                out = out.reshape(tokens, self.num_heads * self.head_dim)
                return out if blocks[0] is None else attach(out, *blocks)
            out = runtime.call("paged_attention", self._heads(q, self.num_heads), self.k_cache, self.v_cache, attn,
                               self.scale, self.sliding_window, self.logit_softcap)
        else:
            if rotary is not None:
                q, k = rotary(positions, q, k)
            out = runtime.call("varlen_attention", self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads),
                               self._heads(v, self.num_kv_heads), attn, self.scale, self.sliding_window,
                               self.logit_softcap)
        return out.reshape(tokens, self.num_heads * self.head_dim)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], heads, self.head_dim)
