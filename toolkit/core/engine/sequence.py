"""One request's state as the engine sees it: tokens, progress, KV blocks, and block arithmetic."""
from __future__ import annotations

import enum
import time

from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"    # queued, or preempted and waiting to be recomputed
    RUNNING = "running"    # holds KV blocks and is scheduled every step
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens; ``num_computed_tokens`` of them already have KV in the cache.

    The KV cache holds ``block_table`` blocks of ``block_size`` token slots each; token ``i``
    lives in block ``block_table[i // block_size]`` at offset ``i % block_size``.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, block_size: int,
                 prompt: str | None = None):
        self.request_id, self.prompt, self.params, self.block_size = request_id, prompt, params, block_size
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0      # prompt tokens whose KV came from the prefix cache
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of full blocks (tokens only grow, so kept)
        self.num_committed_blocks = 0      # leading blocks already offered to the prefix cache
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.logprobs: list[dict] = []
        self.prompt_logprobs: list[dict | None] = [None]  # entry i: prompt token i given tokens < i
        self.generator = None  # torch.Generator of a seeded request, made on the logits' device
        self.text = ""

    # ---- tokens -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt log-probabilities were asked for and some are still missing."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    # ---- blocks -----------------------------------------------------------------------------
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks needed to hold the first ``num_tokens`` tokens."""
        return (num_tokens + self.block_size - 1) // self.block_size

    def block_tokens(self, index: int) -> list[int]:
        return self.token_ids[index * self.block_size:(index + 1) * self.block_size]

    def num_full_blocks(self, num_tokens: int) -> int:
        return num_tokens // self.block_size

    def reset_for_recompute(self) -> None:
        """Preempted: its KV is dropped; prompt and outputs so far will be prefilled again."""
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table = []
        self.num_committed_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
