"""LoadedModel: what ``toolkit.load`` returns, with ``logits`` and a plain greedy ``generate``.

``generate`` is deliberately simple (one sequence, a small paged cache of its own); the
batching engine in core/engine/ is the fast path. Both drive the same model forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from .arch import ModelArch
from .argmax import argmax_rows
from .config import ModelConfig
from .layers.attention import Attention, AttentionMetadata
from .layers.recurrent import allocate_states, bind_states, recurrent_states
from .parallel import ParallelContext
from .report import LoadReport
from .threads import CoreShare

BLOCK_SIZE = 16


@dataclass
class LoadedModel:
    model: nn.Module
    config: ModelConfig
    tokenizer: Any
    report: LoadReport
    arch: ModelArch
    scheme: Any
    parallel: ParallelContext
    device: torch.device

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Logits for every position of one sequence: float32 [len, vocab]."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device).flatten()
        positions = torch.arange(ids.shape[0], device=self.device)
        hidden = self.model(ids, positions, AttentionMetadata.for_prompts([ids.shape[0]], self.device))
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def generate(self, token_ids: Sequence[int] | torch.Tensor, max_new_tokens: int = 32,
                 stop_token_ids: Sequence[int] | None = None) -> list[int]:
        """Greedy continuation (new tokens only); stops early at an end-of-sequence token."""
        prompt = [int(t) for t in torch.as_tensor(token_ids).flatten().tolist()]
        stops = set(self.config.eos_token_ids if stop_token_ids is None else stop_token_ids)
        cache = _SingleSequenceCache(self.model, len(prompt) + max_new_tokens, self.device, self.scheme.params_dtype)
        out: list[int] = []
        step_ids, start = prompt, 0
        cores = CoreShare() if self.device.type == "cpu" else None
        if cores is not None:
            cores.settle()
        with cache:
            for _ in range(max_new_tokens):
                if cores is not None:
                    cores.adjust()
                hidden = self.model(*cache.step_inputs(step_ids, start))
                next_id = int(argmax_rows(self.model.compute_logits(hidden[-1:])))
                out.append(next_id)
                if next_id in stops:
                    break
                start += len(step_ids)
                step_ids = [next_id]
        return out

    def generate_text(self, prompt: str, max_new_tokens: int = 32) -> str:
        ids = self.tokenizer.encode(prompt)
        return self.tokenizer.decode(self.generate(ids, max_new_tokens), skip_special_tokens=True)

    def close(self) -> None:
        """Nothing to release for an in-process model (the multi-process handle shuts workers down)."""


class _SingleSequenceCache:
    """A private paged KV cache holding one sequence in consecutive blocks (and one slot of
    recurrent state for the layers that keep one)."""

    def __init__(self, model: nn.Module, max_tokens: int, device: torch.device, dtype: torch.dtype):
        self.layers = [m for m in model.modules() if isinstance(m, Attention)]
        self.states = recurrent_states(model)
        self.num_blocks = (max_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.device, self.dtype = device, dtype

    def __enter__(self):
        for layer in self.layers:
            shape = (self.num_blocks, BLOCK_SIZE, layer.num_kv_heads, layer.head_dim)
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        bind_states(self.states, allocate_states(self.states, 1, self.dtype, self.device))
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            layer.k_cache = layer.v_cache = None
        bind_states(self.states, None)

    def step_inputs(self, ids: list[int], start: int):
        count = len(ids)
        positions = torch.arange(start, start + count, device=self.device)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, count], dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor([start + count], dtype=torch.int32, device=self.device),
            slot_mapping=positions.to(torch.int64),
            block_tables=torch.arange(self.num_blocks, dtype=torch.int32, device=self.device).unsqueeze(0),
            max_query_len=count, max_seq_len=start + count,
            state_slots=torch.zeros(1, dtype=torch.int64, device=self.device) if self.states else None)
        return torch.tensor(ids, dtype=torch.long, device=self.device), positions, meta
