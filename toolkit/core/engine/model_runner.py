"""Runs one engine step on one rank: builds the flat batch and its AttentionMetadata, owns the KV
cache of this rank's Attention layers and the recurrent-state pool of its RecurrentState layers,
and replays CUDA graphs for decode batches.

Cache budget (per rank): layers declare what they cache. Attention layers get paged KV blocks,
sized by those layers alone; RecurrentState layers get one fixed-size slot per running sequence
(``max_num_seqs`` slots, fewer only if the budget is that small) plus one null slot that padded
rows of a captured decode graph write into. The state pool is taken off the budget first and
the KV blocks fill the rest, so ``kv_cache_bytes + state_bytes <= budget``.

Everything it receives (``RunnerConfig``, ``StepInput``) is plain picklable data, so under
tensor parallelism the same step runs on every rank from the parent's description.
"""
from __future__ import annotations

import itertools
import os
import warnings
from dataclasses import dataclass, field

import torch

from ..errors import ToolkitError
from ..layers.attention import AttentionMetadata
from ..layers.recurrent import allocate_states, bind_states, recurrent_states
from . import kv_cache
from .cuda_graphs import DecodeGraphs, capture_failure
from .prefill_graphs import MIN_TOKENS as PREFILL_MIN_TOKENS
from .prefill_graphs import PrefillGraphs


@dataclass(frozen=True)
class RunnerConfig:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_cache_memory: int | None = None      # bytes; None: sized from free device memory (CPU: fixed default)
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False             # no CUDA graphs


@dataclass
class StepInput:
    """One step's batch: for each sequence, its new tokens and where its KV lives.

    :param token_ids: new tokens of every sequence, flattened in sequence order
    :param query_lens: new tokens per sequence
    :param starts: tokens already in the cache per sequence (position of its first new token)
    :param block_tables: KV block ids per sequence
    :param sample_rows: sequences whose last new token's logits are returned, in this order
    :param all_logits_rows: sequences whose every new token's logits are returned too, after the
        sample rows' (in this order, each sequence's tokens in order); for prompt log-probabilities
    :param state_slots: recurrent-state slot per sequence (None for a model without recurrent layers)
    :param input_ids: the new tokens already on the device (the step before's samples, when the engine
        runs ahead); ``token_ids`` then holds placeholders of the same length. Never set under tensor
        parallelism (a device tensor does not travel to the ranks).
    """

    token_ids: list[int]
    query_lens: list[int]
    starts: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    all_logits_rows: list[int] = field(default_factory=list)
    state_slots: list[int] | None = None
    input_ids: torch.Tensor | None = None

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.query_lens)


def graph_blockers(model: torch.nn.Module) -> str | None:
    """Why the model's decode step cannot be captured in a CUDA graph, or None.

    A quant scheme whose ``apply`` synchronises with the host (data-dependent shapes) says so
    with a ``cuda_graph_blocker`` attribute (a sentence, or None); capturing it would fail."""
    return "; ".join(dict.fromkeys(note for note in _scheme_values(model, "cuda_graph_blocker") if note)) or None


def graph_token_limit(model: torch.nn.Module) -> int | None:
    """The most tokens per step any layer's scheme can run inside a CUDA graph, or None (no limit).

    A scheme whose small-batch kernels are capturable but whose larger-batch path synchronises
    with the host says so with a ``cuda_graph_max_tokens`` attribute (an int, or None); decode
    steps with more sequences, and prefill steps with more tokens, then run eagerly."""
    return min(_scheme_values(model, "cuda_graph_max_tokens"), default=None)


def _scheme_values(model: torch.nn.Module, attribute: str) -> list:
    """``attribute`` of every layer's quant scheme that has it set (not None), in module order."""
    return [value for module in model.modules()
            if (value := getattr(getattr(module, "scheme", None), attribute, None)) is not None]


class CacheBudgetError(ToolkitError, ValueError):
    """The cache budget cannot hold one sequence's recurrent state and KV at the model's length."""


class ModelRunner:
    def __init__(self, loaded, config: RunnerConfig):
        self.loaded, self.model, self.config = loaded, loaded.model, config
        self.device = torch.device(loaded.device)
        self.layers = kv_cache.attention_layers(self.model)
        self.states = recurrent_states(self.model)
        self.dtype = kv_cache.cache_dtype(loaded)
        self.block_bytes = kv_cache.bytes_per_block(self.layers, config.block_size, self.dtype)
        self.slot_bytes = sum(state.bytes_per_slot(self.dtype) for state in self.states)
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        self.num_blocks = self.num_slots = 0
        self.budget: int | None = None
        self.caches: list[tuple[torch.Tensor, torch.Tensor]] = []  # ours, even while another engine binds its own
        self.state_tensors: list[dict[str, torch.Tensor]] = []
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None  # captured lazily, per bucket, as steps need them
        self.graph_note: str | None = None     # why decode runs eagerly on CUDA, if it does

    # ---- KV cache and state pool -------------------------------------------------------------
    def profile_num_blocks(self) -> tuple[int, int]:
        """(KV blocks, recurrent-state slots) this rank can hold (an explicit budget, or free device memory)."""
        budget = self.config.kv_cache_memory
        if budget is None and self.device.type == "cuda":
            budget = kv_cache.cuda_budget(self.device, self.config.gpu_memory_utilization, self._activation_peak())
        elif budget is None:
            budget = kv_cache.CPU_DEFAULT_KV_BYTES
        self.budget = budget
        num_slots = self._num_state_slots(budget)
        kv_budget = budget - self.state_bytes(num_slots)
        most_useful = (num_slots or self.config.max_num_seqs) * self.max_blocks_per_seq + 1
        num_blocks = most_useful if not self.block_bytes else min(kv_budget // self.block_bytes, most_useful)
        return int(num_blocks), num_slots

    def state_bytes(self, num_slots: int) -> int:
        """Bytes of a pool of ``num_slots`` slots plus its null slot (0 without recurrent layers)."""
        return (num_slots + 1) * self.slot_bytes if self.states and num_slots else 0

    def _num_state_slots(self, budget: int) -> int:
        """One slot per running sequence, unless the budget cannot also hold one full-length sequence's KV."""
        if not self.states:
            return 0
        room = (budget - self.max_blocks_per_seq * self.block_bytes) // self.slot_bytes - 1  # less the null slot
        if room < 1:
            raise CacheBudgetError(
                f"a cache budget of {budget} bytes cannot hold one sequence's recurrent state ({self.slot_bytes} bytes) "
                f"and its KV at max_model_len {self.config.max_model_len}; raise kv_cache_memory or lower max_model_len")
        return int(min(self.config.max_num_seqs, room))

    def memory_report(self) -> dict[str, int | None]:
        """What this rank's cache holds: KV for the attention layers, one state slot per sequence."""
        return {"budget_bytes": self.budget, "kv_cache_bytes": self.num_blocks * self.block_bytes,
                "kv_tokens": self.num_blocks * self.config.block_size, "kv_blocks": self.num_blocks,
                "kv_bytes_per_token": self.block_bytes // self.config.block_size,
                "attention_layers": len(self.layers), "recurrent_layers": len(self.states),
                "state_bytes": self.state_bytes(self.num_slots), "state_slots": self.num_slots,
                "state_bytes_per_slot": self.slot_bytes}

    @torch.inference_mode()
    def _activation_peak(self) -> int:
        """Memory a full-budget prefill needs beyond the weights, measured with a dummy batch."""
        tokens = min(self.config.max_num_batched_tokens, self.config.max_model_len)
        blocks = -(-tokens // self.config.block_size)
        self.caches = kv_cache.allocate(self.layers, blocks, self.config.block_size, self.dtype, self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self.execute(StepInput([0] * tokens, [tokens], [0], [list(range(blocks))], [0]), graphs=False)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        kv_cache.unbind(self.layers, self.caches)
        self.caches = []
        torch.cuda.empty_cache()
        return peak

    def allocate(self, num_blocks: int, num_slots: int = 0) -> None:
        """Bind the KV cache and state pool and, on CUDA, capture the decode graphs that read them."""
        self.num_blocks, self.num_slots = num_blocks, num_slots
        self.caches = kv_cache.allocate(self.layers, num_blocks, self.config.block_size, self.dtype, self.device)
        kv_cache.bind(self.layers, self.caches)
        if self.states:  # row num_slots is the null slot
            self.state_tensors = allocate_states(self.states, num_slots + 1, self.dtype, self.device)
            bind_states(self.states, self.state_tensors)
        self.graph_note = None
        if self.device.type == "cuda" and not self.config.enforce_eager:
            self.graph_note = graph_blockers(self.model)
            if self.graph_note is None:
                self._capture()
            if self.graph_note is not None:
                warnings.warn(f"decode runs without CUDA graphs: {self.graph_note}", stacklevel=2)

    def _capture(self) -> None:
        """Capture the decode graphs; a capture that fails (a kernel that syncs with the host, say)
        leaves the engine eager with a note, never broken."""
        limit = graph_token_limit(self.model)
        graphs = DecodeGraphs(self, max_batch_size=min(self.config.max_num_seqs, limit or self.config.max_num_seqs))
        pool = torch.cuda.graph_pool_handle()  # one pool for every graph: only one replays at a time
        try:
            graphs.capture(pool)
        except Exception as exc:  # noqa: BLE001 - whatever a kernel raised inside capture
            torch.cuda.synchronize(self.device)
            self.graph_note = f"CUDA graph capture failed ({capture_failure(exc)})"
            return
        self.graphs = graphs
        if os.environ.get("TOOLKIT_PREFILL_GRAPHS", "1") != "0" and (limit is None or limit >= PREFILL_MIN_TOKENS):
            max_tokens = self.config.max_num_batched_tokens
            if limit is not None:  # buckets are PREFILL_MIN_TOKENS times powers of two: the largest within it
                max_tokens = min(max_tokens, PREFILL_MIN_TOKENS << (limit // PREFILL_MIN_TOKENS).bit_length() - 1)
            self.prefill_graphs = PrefillGraphs(self, pool, max_tokens)

    @property
    def null_slot(self) -> int:
        return self.num_slots

    def close(self) -> None:
        self.graphs = self.prefill_graphs = None
        kv_cache.unbind(self.layers, self.caches)
        if self.states and self.states[0].tensors is (self.state_tensors[0] if self.state_tensors else None):
            bind_states(self.states, None)
        self.caches, self.state_tensors = [], []

    # ---- one step ---------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, step: StepInput, graphs: bool = True) -> torch.Tensor:
        """Logits [len(step.sample_rows), vocab] for the last new token of each sampling sequence,
        followed by those of every new token of each ``step.all_logits_rows`` sequence."""
        if not kv_cache.is_bound(self.layers, self.caches):  # another engine on this model bound its own
            kv_cache.bind(self.layers, self.caches)
        if self.state_tensors and self.states[0].tensors is not self.state_tensors[0]:
            bind_states(self.states, self.state_tensors)
        if graphs and self.graphs is not None and not step.all_logits_rows and self.graphs.can_run(step):
            return self.graphs.run(step)
        if graphs and self.prefill_graphs is not None and (key := self.prefill_graphs.bucket(step)):
            logits = self.prefill_graphs.run(step, key)
            if logits is not None:
                return logits
        input_ids, positions, attn = self.prepare(step)
        hidden = self.model(input_ids, positions, attn)
        return self.model.compute_logits(hidden[self.logits_positions(step)])

    def logits_positions(self, step: StepInput) -> torch.Tensor:
        """Flat token positions whose logits ``execute`` returns, in its order."""
        ends = list(itertools.accumulate(step.query_lens))
        rows = [ends[row] - 1 for row in step.sample_rows]
        for row in step.all_logits_rows:
            rows.extend(range(ends[row] - step.query_lens[row], ends[row]))
        return self._tensor(rows)

    def host_batch(self, step: StepInput) -> dict[str, torch.Tensor]:
        """The step's flat positions, KV slots and per-sequence offsets, built on the host."""
        query_lens = torch.tensor(step.query_lens, dtype=torch.int64)
        starts = torch.tensor(step.starts, dtype=torch.int64)
        query_start_loc = torch.zeros(len(step.query_lens) + 1, dtype=torch.int64)
        torch.cumsum(query_lens, 0, out=query_start_loc[1:])
        seq_index = torch.repeat_interleave(torch.arange(len(step.query_lens)), query_lens)
        positions = torch.arange(len(step.token_ids)) - query_start_loc[seq_index] + starts[seq_index]
        block_tables = self.block_table_tensor(step.block_tables)
        slots = (block_tables[seq_index, positions // self.config.block_size].long() * self.config.block_size
                 + positions % self.config.block_size)
        return {"query_start_loc": query_start_loc, "positions": positions, "slots": slots,
                "seq_lens": starts + query_lens, "block_tables": block_tables}

    def prepare(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids and positions, and the metadata that tells attention where KV lives."""
        batch = self.host_batch(step)
        attn = AttentionMetadata(
            query_start_loc=self._tensor(batch["query_start_loc"], torch.int32),
            seq_lens=self._tensor(batch["seq_lens"], torch.int32), slot_mapping=self._tensor(batch["slots"]),
            block_tables=self._tensor(batch["block_tables"]), max_query_len=max(step.query_lens),
            max_seq_len=int(batch["seq_lens"].max()),
            state_slots=None if step.state_slots is None else self._tensor(step.state_slots))
        input_ids = step.input_ids if step.input_ids is not None else self._tensor(step.token_ids)
        return input_ids, self._tensor(batch["positions"]), attn

    @staticmethod
    def block_table_tensor(block_tables: list[list[int]], width: int | None = None) -> torch.Tensor:
        width = width or max(len(t) for t in block_tables)
        return torch.tensor([t + [-1] * (width - len(t)) for t in block_tables], dtype=torch.int32)

    def _tensor(self, data, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        if isinstance(data, torch.Tensor):
            return data.to(device=self.device, dtype=dtype, non_blocking=True)
        return torch.tensor(data, dtype=dtype, device=self.device)
