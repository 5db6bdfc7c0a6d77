"""CUDA graphs for decode steps (one new token per sequence).

A decode step launches hundreds of small kernels; replaying a captured graph removes the
launch overhead. One graph is captured per batch size in ``batch_sizes``; a step with ``n``
sequences replays the smallest graph of at least ``n``, with the spare rows padded (slot -1:
nothing stored; context length 0: nothing read; recurrent layers read and write the runner's
null state slot). Inputs live in static buffers the graphs
read; the block-table buffer is as wide as ``max_model_len`` needs, so no step outgrows it.
"""
from __future__ import annotations

import numpy as np
import torch

from ..layers.attention import AttentionMetadata


def record(forward, pool, device: torch.device):
    """Run ``forward()`` once outside capture (compiles kernels, settles the allocator), then capture
    it into a graph on ``pool``. Returns the graph and the output tensor its replays overwrite."""
    forward()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    return graph, out


def capture_failure(exc: Exception) -> str:
    """One line on why a capture failed: the exception's type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch_size + 1, 16))
    return sorted({size for size in sizes if size <= max_batch_size} | {max_batch_size})


class DecodeGraphs:
    def __init__(self, runner, max_batch_size: int):
        self.runner, self.device = runner, runner.device
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        size, width = self.batch_sizes[-1], runner.max_blocks_per_seq
        self.width = width
        # Every per-step input lives in two device buffers (int64 and int32) that one host-to-device
        # copy each fills from pinned host buffers: a step's host cost is a few numpy writes and
        # two copies, not one tensor and copy per input. The static inputs are views of them.
        # The host buffers come in two sets used in turn: when the engine runs ahead, a step's
        # inputs are written while the step before may not have copied its own yet (the set a step
        # reuses was the one two steps back, whose tokens the engine has read, so its copy is done).
        pinned = torch.cuda.is_available()
        self.host64s = [torch.zeros(4 * size, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self.host32s = [torch.zeros(size + size * width, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self.turn = 0
        self.dev64 = torch.zeros(4 * size, dtype=torch.int64, device=self.device)
        self.dev32 = torch.zeros(size + size * width, dtype=torch.int32, device=self.device)
        self.input_ids, self.positions, self.slot_mapping, state_slots = self.dev64.view(4, size)
        self.seq_lens, self.block_tables = self.dev32[:size], self.dev32[size:].view(size, width)
        self.slot_mapping.fill_(-1)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=self.device)
        self.state_slots = None
        if runner.states:
            self.state_slots = state_slots
            self.state_slots.fill_(runner.null_slot)
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
            self.graphs[size], self.logits[size] = record(lambda: self._forward(size), pool, self.device)
        torch.cuda.synchronize(self.device)

    def can_run(self, step) -> bool:
        return step.is_decode and len(step.query_lens) <= self.batch_sizes[-1]

    def run(self, step) -> torch.Tensor:
        count = len(step.query_lens)
        size = next(s for s in self.batch_sizes if s >= count)
        full = self.batch_sizes[-1]
        block_size = self.runner.config.block_size
        self.turn ^= 1
        host64_buffer, host32_buffer = self.host64s[self.turn], self.host32s[self.turn]
        host64 = host64_buffer.numpy().reshape(4, full)
        host32 = host32_buffer.numpy()
        positions = np.asarray(step.starts, dtype=np.int64)
        tables = host32[full:].reshape(full, self.width)
        for row, table in enumerate(step.block_tables):  # a row's stale tail past its blocks is never read
            tables[row, :len(table)] = table
        blocks = np.fromiter((table[p // block_size] for table, p in zip(step.block_tables, step.starts)),
                             dtype=np.int64, count=count)
        # a step run ahead brings its ids on the device (its token_ids are placeholders, never valid
        # ids); spare rows get id 0, so a later, smaller batch never embeds a stale placeholder
        host64[0, :count] = step.token_ids if step.input_ids is None else 0
        host64[0, count:size] = 0
        host64[1, :count] = positions
        host64[2, :count] = blocks * block_size + positions % block_size
        host64[2, count:size] = -1                                   # spare rows: nothing stored
        if self.state_slots is not None:
            host64[3, :count] = step.state_slots
            host64[3, count:size] = self.runner.null_slot
        host32[:count] = positions + 1
        host32[count:size] = 0                                       # spare rows: nothing read
        self.dev64.copy_(host64_buffer, non_blocking=True)
        used = full + count * self.width
        self.dev32[:used].copy_(host32_buffer[:used], non_blocking=True)
        if step.input_ids is not None:  # run-ahead: the step before's samples, still on the device
            self.input_ids[:count].copy_(step.input_ids)
        self.graphs[size].replay()
        if list(step.sample_rows) == list(range(count)):  # the usual decode step: no index upload
            return self.logits[size][:count].clone()
        rows = torch.tensor(step.sample_rows, dtype=torch.int64, device=self.device)
        return self.logits[size][rows]
