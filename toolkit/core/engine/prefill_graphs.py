"""CUDA graphs for prefill and mixed steps, captured lazily per (token, sequence) bucket.

A prefill step launches the same hundreds of kernels as a decode step, each paying Python's and
Triton's launch cost on the host (tens of microseconds), so a short prompt's prefill is bound by
the host, not the GPU. A step with ``n`` sequences and ``N`` new tokens replays the graph of the
bucket (``T`` tokens >= N, ``S`` sequences >= n), captured the first time that bucket is needed.

Padding keeps every kernel's work within the real batch:
- the ``T - N`` spare tokens belong to no sequence (``query_start_loc`` ends at N for the
  ``S - n`` spare sequences, which have no tokens and context length 0) and have KV slot -1, so
  attention neither reads nor stores them and recurrent layers give them the null state slot;
- the rows the graph computes logits for are a static index buffer (``S`` rows; the spare ones
  point at row 0), so the LM head costs ``S`` rows, never ``T``.
Every layer is row-independent outside attention, so the spare rows' values never reach a real
row. A bucket whose capture fails (a kernel that synchronises with the host, say) runs eagerly
from then on; the first failure is kept as a note and warned about once.
"""
from __future__ import annotations

import warnings

import torch

from ..layers.attention import AttentionMetadata
from .cuda_graphs import capture_failure, record

MIN_TOKENS = 16
MAX_TOKENS = 2048   # above this a step's kernels outlast their launches, so eager costs little
MAX_GRAPHS = 24     # lazily captured buckets kept at most; later new buckets run eagerly


def _bucket(count: int, smallest: int) -> int:
    size = smallest
    while size < count:
        size *= 2
    return size


class PrefillGraphs:
    """Static input buffers shared by every bucket, and the graphs captured so far."""

    def __init__(self, runner, pool, max_tokens: int):
        self.runner, self.device, self.pool = runner, runner.device, pool
        self.max_tokens = min(MAX_TOKENS, _bucket(max_tokens, MIN_TOKENS))
        self.max_seqs = runner.config.max_num_seqs
        size, seqs, width = self.max_tokens, self.max_seqs, runner.max_blocks_per_seq
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=self.device)
        self.query_start_loc = torch.zeros(seqs + 1, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.zeros(seqs, dtype=torch.int32, device=self.device)
        self.block_tables = torch.zeros((seqs, width), dtype=torch.int32, device=self.device)
        self.sample_index = torch.zeros(seqs, dtype=torch.int64, device=self.device)
        self.state_slots = (torch.full((seqs,), runner.null_slot, dtype=torch.int64, device=self.device)
                            if runner.states else None)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        self.failed: set[tuple[int, int]] = set()
        self.note: str | None = None

    def bucket(self, step) -> tuple[int, int] | None:
        """The (tokens, sequences) bucket ``step`` replays, or None if it runs eagerly."""
        tokens, seqs = len(step.token_ids), len(step.query_lens)
        if step.all_logits_rows or tokens > self.max_tokens or seqs > self.max_seqs:
            return None
        key = (_bucket(tokens, MIN_TOKENS), min(_bucket(seqs, 1), self.max_seqs))
        if key in self.failed or (key not in self.graphs and len(self.graphs) >= MAX_GRAPHS):
            return None
        return key

    def _metadata(self, key: tuple[int, int]) -> AttentionMetadata:
        tokens, seqs = key
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:seqs + 1], seq_lens=self.seq_lens[:seqs],
            slot_mapping=self.slot_mapping[:tokens], block_tables=self.block_tables[:seqs], max_query_len=tokens,
            max_seq_len=self.runner.config.max_model_len,
            state_slots=None if self.state_slots is None else self.state_slots[:seqs])

    def _forward(self, key: tuple[int, int]) -> torch.Tensor:
        tokens, seqs = key
        model = self.runner.model
        hidden = model(self.input_ids[:tokens], self.positions[:tokens], self._metadata(key))
        return model.compute_logits(hidden[self.sample_index[:seqs]])

    def _fill(self, step, key: tuple[int, int]) -> None:
        """Copy the step into the static buffers; the spare tokens and sequences are made inert."""
        tokens, seqs = key
        count, total = len(step.query_lens), len(step.token_ids)
        batch = self.runner.host_batch(step)
        tables = batch["block_tables"]
        ids = step.input_ids if step.input_ids is not None else torch.tensor(step.token_ids, dtype=torch.int64)
        self.input_ids[:total].copy_(ids, non_blocking=True)
        self.positions[:total].copy_(batch["positions"], non_blocking=True)
        self.slot_mapping[:total].copy_(batch["slots"], non_blocking=True)
        self.slot_mapping[total:tokens].fill_(-1)
        self.query_start_loc[:count + 1].copy_(batch["query_start_loc"], non_blocking=True)
        self.query_start_loc[count + 1:seqs + 1].fill_(total)
        self.seq_lens[:count].copy_(batch["seq_lens"], non_blocking=True)
        self.seq_lens[count:seqs].fill_(0)
        self.block_tables[:count, :tables.shape[1]].copy_(tables, non_blocking=True)
        rows = self.runner.logits_positions(step)  # bucket() took no step with all_logits_rows
        self.sample_index[:len(rows)].copy_(rows, non_blocking=True)
        self.sample_index[len(rows):seqs].fill_(0)
        if self.state_slots is not None:
            self.state_slots[:count].copy_(torch.tensor(step.state_slots, dtype=torch.int64), non_blocking=True)
            self.state_slots[count:seqs].fill_(self.runner.null_slot)

    def _make_inert(self) -> None:
        """Every sequence empty and every slot -1: a forward then stores, reads and advances nothing
        (the warm-up before a capture runs for real, and must not touch a sequence's KV or state)."""
        self.slot_mapping.fill_(-1)
        self.query_start_loc.zero_()
        self.seq_lens.zero_()
        self.sample_index.zero_()
        if self.state_slots is not None:
            self.state_slots.fill_(self.runner.null_slot)

    def _capture(self, key: tuple[int, int]) -> bool:
        self._make_inert()
        try:
            self.graphs[key], self.logits[key] = record(lambda: self._forward(key), self.pool, self.device)
        except Exception as exc:  # noqa: BLE001 - whatever a kernel raised inside capture
            torch.cuda.synchronize(self.device)
            self.failed.add(key)
            if self.note is None:  # warn once: later failing buckets run eagerly without a word
                self.note = (f"prefill CUDA graph capture failed at {key[0]} tokens, {key[1]} sequences "
                             f"({capture_failure(exc)})")
                warnings.warn(f"a prefill bucket runs without CUDA graphs: {self.note}", stacklevel=4)
            return False
        return True

    def run(self, step, key: tuple[int, int]) -> torch.Tensor | None:
        """Logits of ``step.sample_rows`` from the bucket's graph (captured now if it is new), or None
        if it cannot be captured and the caller must run the step eagerly."""
        if key not in self.graphs and not self._capture(key):
            return None
        self._fill(step, key)
        self.graphs[key].replay()
        return self.logits[key][:len(step.sample_rows)].clone()
