"""Vocab-parallel embedding (padded so every rank holds the same number of rows) and LM head."""
from __future__ import annotations

import torch
from torch import nn

from ..parallel import ParallelContext
from ..quant import QuantScheme

VOCAB_PADDING = 64


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    step = VOCAB_PADDING * tp_size
    return (vocab_size + step - 1) // step * step


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r * rows_per_rank, (r + 1) * rows_per_rank) of the padded table."""

    layer_kind = "embedding"

    def __init__(self, vocab_size: int, embedding_dim: int, *, quant: QuantScheme, parallel: ParallelContext,
                 prefix: str):
        super().__init__()
        self.vocab_size, self.embedding_dim, self.parallel, self.prefix = vocab_size, embedding_dim, parallel, prefix
        self.rows_per_rank = padded_vocab_size(vocab_size, parallel.tp_size) // parallel.tp_size
        self.vocab_start = parallel.tp_rank * self.rows_per_rank
        self.num_real_rows = max(0, min(vocab_size - self.vocab_start, self.rows_per_rank))
        self.shard_ids = (None,)
        self.scheme = quant.scheme_for(layer_kind=self.layer_kind, prefix=prefix)
        self.scheme.create_weights(self, input_size_per_partition=embedding_dim,
                                   output_partition_sizes=[self.rows_per_rank], input_size=embedding_dim,
                                   output_size=vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return self.scheme.embed(self, ids)
        is_local = (ids >= self.vocab_start) & (ids < self.vocab_start + self.rows_per_rank)
        local = torch.where(is_local, ids - self.vocab_start, torch.zeros_like(ids))
        rows = self.scheme.embed(self, local) * is_local.unsqueeze(-1)
        return self.parallel.all_reduce(rows)

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        # a rank wholly past the real vocab (small vocab, large tp) holds only padding: it copies 0 rows
        start = min(self.vocab_start, self.vocab_size)
        getattr(self, param_name).load_rows(loaded, source_start=start, size=self.num_real_rows)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's logits for ``hidden`` against the table (used by a tied LM head)."""
        return self.scheme.apply(self, hidden, None)


class ParallelLMHead(nn.Module):
    """Vocab-parallel output projection; ``tied_to`` reuses the embedding's (possibly quantized) table."""

    layer_kind = "lm_head"

    def __init__(self, vocab_size: int, hidden_size: int, *, quant: QuantScheme, parallel: ParallelContext,
                 prefix: str, tied_to: VocabParallelEmbedding | None = None):
        super().__init__()
        self.vocab_size, self.parallel, self.prefix = vocab_size, parallel, prefix
        self.tied_to = tied_to
        if tied_to is None:  # own table: same row layout as the embedding, weights named lm_head.weight
            self.rows_per_rank = padded_vocab_size(vocab_size, parallel.tp_size) // parallel.tp_size
            self.vocab_start = parallel.tp_rank * self.rows_per_rank
            self.num_real_rows = max(0, min(vocab_size - self.vocab_start, self.rows_per_rank))
            self.shard_ids = (None,)
            self.scheme = quant.scheme_for(layer_kind=self.layer_kind, prefix=prefix)
            self.scheme.create_weights(self, input_size_per_partition=hidden_size,
                                       output_partition_sizes=[self.rows_per_rank], input_size=hidden_size,
                                       output_size=vocab_size)

    def __setattr__(self, name, value):
        if name == "tied_to" and isinstance(value, nn.Module):
            object.__setattr__(self, name, value)  # not a submodule: its weight belongs to the embedding
        else:
            super().__setattr__(name, value)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.tied_to.project(hidden) if self.tied_to is not None else self.scheme.apply(self, hidden, None)
        return self.parallel.all_gather(local)[..., : self.vocab_size]

    load_weight = VocabParallelEmbedding.load_weight
