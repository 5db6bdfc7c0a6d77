"""CUDA graphs for decode steps (one new token per sequence).

A decode step launches hundreds of small kernels; replaying a captured graph removes the
launch overhead. One graph is captured per batch size in ``batch_sizes``; a step with ``n``
sequences replays the smallest graph of at least ``n``, with the spare rows padded (slot -1:
nothing stored; context length 0: nothing read; recurrent layers read and write the runner's
null state slot). Inputs live in static buffers the graphs
read; the block-table buffer is as wide as ``max_model_len`` needs, so no step outgrows it.
"""
from __future__ import annotations

import torch

from ..layers.attention import AttentionMetadata


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch_size + 1, 16))
    return sorted({size for size in sizes if size <= max_batch_size} | {max_batch_size})


class DecodeGraphs:
    def __init__(self, runner, max_batch_size: int):
        self.runner, self.device = runner, runner.device
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        size, width = self.batch_sizes[-1], runner.max_blocks_per_seq
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=self.device)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=self.device)
        self.block_tables = torch.zeros((size, width), dtype=torch.int32, device=self.device)
        self.state_slots = (torch.full((size,), runner.null_slot, dtype=torch.int64, device=self.device)
                            if runner.states else None)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
                                 slot_mapping=self.slot_mapping[:size], block_tables=self.block_tables[:size],
                                 max_query_len=1, max_seq_len=self.runner.config.max_model_len,
                                 state_slots=None if self.state_slots is None else self.state_slots[:size])

    def _forward(self, size: int) -> torch.Tensor:
        model = self.runner.model
        hidden = model(self.input_ids[:size], self.positions[:size], self._metadata(size))
        return model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self, pool) -> None:
        """Capture largest first, so the smaller graphs reuse the largest one's memory pool."""
        for size in reversed(self.batch_sizes):
            self._forward(size)  # warm-up outside capture: compiles kernels, settles the allocator
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, step) -> bool:
        return step.is_decode and len(step.query_lens) <= self.batch_sizes[-1]

    def run(self, step) -> torch.Tensor:
        count = len(step.query_lens)
        size = next(s for s in self.batch_sizes if s >= count)
        positions = torch.tensor(step.starts, dtype=torch.int64)
        tables = self.runner.block_table_tensor(step.block_tables)
        block_size = self.runner.config.block_size
        slots = tables[torch.arange(count), positions // block_size].long() * block_size + positions % block_size
        self.input_ids[:count].copy_(torch.tensor(step.token_ids, dtype=torch.int64), non_blocking=True)
        self.positions[:count].copy_(positions, non_blocking=True)
        self.slot_mapping[:count].copy_(slots, non_blocking=True)
        self.slot_mapping[count:size].fill_(-1)
        self.seq_lens[:count].copy_(positions + 1, non_blocking=True)
        self.seq_lens[count:size].fill_(0)
        self.block_tables[:count, :tables.shape[1]].copy_(tables, non_blocking=True)
        if self.state_slots is not None:
            self.state_slots[:count].copy_(torch.tensor(step.state_slots, dtype=torch.int64), non_blocking=True)
            self.state_slots[count:size].fill_(self.runner.null_slot)
        self.graphs[size].replay()
        rows = torch.tensor(step.sample_rows, dtype=torch.int64, device=self.device)
        return self.logits[size][rows]
