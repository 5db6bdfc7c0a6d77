"""Where the model runner lives: in this process, or on every rank of a tensor-parallel handle.

The scheduler and sampler stay in the caller's process; each step sends a plain ``StepInput``
to the runner(s) and gets rank 0's logits back. Under tensor parallelism the rank functions
below run on every worker through ``ParallelModel.run`` (module-level, so they pickle by name);
each rank keeps its runners in ``_RUNNERS`` under the engine's id, so several engines may
share one loaded model (each with its own KV cache).
"""
from __future__ import annotations

import uuid

import torch

from .model_runner import ModelRunner, RunnerConfig, StepInput

_RUNNERS: dict[str, ModelRunner] = {}


def _rank_start(loaded, engine_id: str, config: RunnerConfig) -> tuple[int, int]:
    """Create this rank's runner; returns the (KV blocks, state slots) all ranks can hold (minimum over ranks)."""
    runner = _RUNNERS[engine_id] = ModelRunner(loaded, config)
    num_blocks, num_slots = runner.profile_num_blocks()
    if loaded.parallel.tp_size > 1:  # ranks may see different free memory; block and slot ids must mean the same
        import torch.distributed as dist  # noqa: PLC0415

        agreed = torch.tensor([num_blocks, num_slots], dtype=torch.int64, device=loaded.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=loaded.parallel.group)
        num_blocks, num_slots = (int(v) for v in agreed.tolist())
    return num_blocks, num_slots


def _rank_allocate(loaded, engine_id: str, num_blocks: int, num_slots: int = 0) -> None:
    _RUNNERS[engine_id].allocate(num_blocks, num_slots)


def _rank_memory(loaded, engine_id: str) -> dict:
    return _RUNNERS[engine_id].memory_report()


def _rank_execute(loaded, engine_id: str, step: StepInput):
    logits = _RUNNERS[engine_id].execute(step)
    return logits if loaded.parallel.tp_rank == 0 else None  # only rank 0's answer travels back


def rank_graph_sizes(loaded, engine_id: str) -> list[int]:
    """The decode batch sizes this rank captured CUDA graphs for (none on CPU or when eager)."""
    graphs = _RUNNERS[engine_id].graphs
    return sorted(graphs.graphs) if graphs is not None else []


def _rank_close(loaded, engine_id: str) -> None:
    runner = _RUNNERS.pop(engine_id, None)
    if runner is not None:
        runner.close()


class LocalExecutor:
    """The runner in this process (also each rank's own engine under a launcher); logits stay on device."""

    def __init__(self, loaded, config: RunnerConfig):
        self.loaded, self.engine_id = loaded, uuid.uuid4().hex
        self.num_blocks, self.num_slots = _rank_start(loaded, self.engine_id, config)
        _rank_allocate(loaded, self.engine_id, self.num_blocks, self.num_slots)
        self.runner = _RUNNERS[self.engine_id]

    def memory_report(self) -> dict:
        return self.runner.memory_report()

    def execute(self, step: StepInput) -> torch.Tensor:
        return self.runner.execute(step)

    def close(self) -> None:
        _rank_close(self.loaded, self.engine_id)


class ParallelExecutor:
    """One runner per rank of a ParallelModel; logits come back to this process on CPU."""

    def __init__(self, handle, config: RunnerConfig):
        self.handle, self.engine_id = handle, uuid.uuid4().hex
        self.num_blocks, self.num_slots = handle.run(_rank_start, self.engine_id, config)
        handle.run(_rank_allocate, self.engine_id, self.num_blocks, self.num_slots)

    def memory_report(self) -> dict:
        """Rank 0's cache (every rank holds the same blocks and slots over its own heads)."""
        return self.handle.run(_rank_memory, self.engine_id)

    def execute(self, step: StepInput) -> torch.Tensor:
        return self.handle.run(_rank_execute, self.engine_id, step)

    def close(self) -> None:
        try:
            self.handle.run(_rank_close, self.engine_id)
        except Exception:  # noqa: BLE001 - the workers may already be gone; nothing to release then
            pass
