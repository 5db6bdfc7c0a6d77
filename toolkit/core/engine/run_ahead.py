"""Run-ahead decoding: launch step k+1 before reading step k's tokens, so the host works while the GPU does.

A synchronous step schedules, builds its inputs, launches the model (a CUDA-graph replay), samples,
reads the tokens back (the host waits for the GPU here) and then updates sequences, stop checks and
outputs while the GPU waits for the next launch. At batch 1 of a small model that host work is a
large share of the step.

When the step after step k is sure to be "these sequences, one token each" (``ahead_items``),
the engine schedules it at once with a placeholder for each token step k is sampling
(``Scheduler.schedule_ahead``) and launches it with its input ids taken from step k's sampled ids
on the device. Only then does it read step k's tokens and do step k's host work, which now
overlaps step k+1 on the GPU. Nothing is guessed: step k+1's inputs are step k's real tokens, so
the tokens are the ones the synchronous engine picks. A sequence that ends by length with step
k's token is left out of step k+1; one that stops on it (end of sequence, a stop id or string)
had one token computed for nothing, and its row of step k+1 is dropped.

What is never run ahead (the next step is then scheduled after the tokens are read): sampling that
needs the tokens on the host (penalties, log-probabilities), a waiting request (it may join), a
prefill chunk that samples nothing, too few free KV blocks (the scheduler would preempt), and
tensor-parallel handles (their logits come back to the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from .sequence import Sequence


@dataclass
class PendingStep:
    """A launched step whose sampled tokens may still be on their way back from the device.

    :param sampling: the sequences that sample, in logits row order
    :param token_ids: the sampled tokens once read (at once for host-side sampling)
    :param device_ids: the sampled tokens on the device (run-ahead launches the next step from them)
    :param host_ids: where ``device_ids`` are being copied (pinned); ``ready`` marks the copy done
    """

    scheduled: SchedulerOutput
    sampling: list[Sequence]
    token_ids: list[int] | None = None
    logprobs: list | None = None
    device_ids: torch.Tensor | None = None
    host_ids: torch.Tensor | None = None
    ready: "torch.cuda.Event | None" = None

    @classmethod
    def on_device(cls, scheduled: SchedulerOutput, sampling: list[Sequence], ids: torch.Tensor) -> "PendingStep":
        """Start copying ``ids`` to the host without waiting for them."""
        if ids.device.type != "cuda":
            return cls(scheduled, sampling, device_ids=ids, host_ids=ids)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(scheduled, sampling, device_ids=ids, host_ids=host, ready=ready)

    def read(self) -> list[int]:
        """The sampled tokens (waits for the device the first time)."""
        if self.token_ids is None:
            if self.ready is not None:
                self.ready.synchronize()
            self.token_ids = self.host_ids.tolist()
        return self.token_ids

    @property
    def is_stale(self) -> bool:
        """Every sequence of it finished (or was aborted) before its tokens were read."""
        return all(item.seq.is_finished for item in self.scheduled.scheduled)


def ahead_items(pending: PendingStep, scheduler: Scheduler, max_model_len: int) -> list[ScheduledSequence]:
    """The chunks of ``pending`` whose sequences the step after it is sure to decode, one token
    each, or [] when that step cannot be scheduled yet.

    Sure means: the tokens are sampled on the device; nothing waits (it might join); the running
    sequences are exactly ``pending``'s live ones, in order, each sampling; and the KV blocks for
    the next positions are free (nothing would be preempted). A sequence that ends by length with
    this token is left out (it stops, whatever the token); one that stops on it (a stop id or
    string) cannot be foreseen, and its row of the next step is dropped when it does."""
    if pending.device_ids is None or scheduler.waiting:
        return []
    live = [item for item in pending.scheduled.scheduled if not item.seq.is_finished]
    if len(live) != len(scheduler.running) or any(item.seq is not seq for item, seq in zip(live, scheduler.running)):
        return []
    chosen, blocks = [], 0
    for item in live:
        seq = item.seq
        if not item.samples:
            return []
        if seq.num_output_tokens + 1 >= seq.params.max_tokens or len(seq) + 1 >= max_model_len:
            continue  # this step's token ends it by length
        blocks += max(0, seq.blocks_needed(len(seq) + 1) - len(seq.block_table))
        chosen.append(item)
    return chosen if blocks <= scheduler.block_manager.num_free_blocks else []


def ahead_input_ids(pending: PendingStep, items: list[ScheduledSequence]) -> torch.Tensor:
    """The sampled ids of ``items``' sequences, on the device, in ``items``' order (no host wait)."""
    index = {id(seq): row for row, seq in enumerate(pending.sampling)}
    rows = [index[id(item.seq)] for item in items]
    if rows == list(range(len(pending.sampling))):
        return pending.device_ids
    ids = pending.device_ids
    # pinned, so the copy queues behind the running step instead of waiting for it
    rows_host = torch.tensor(rows, dtype=torch.int64, pin_memory=ids.device.type == "cuda")
    return ids[rows_host.to(ids.device, non_blocking=True)]
