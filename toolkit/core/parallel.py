"""Tensor-parallel context on torch.distributed (gloo on CPU, NCCL on CUDA).

Layers receive a ParallelContext and use only ``tp_rank``, ``tp_size``, ``all_reduce`` and
``all_gather``; with tp_size 1 these are free no-ops, so a single-process model never
touches torch.distributed.

Nothing here keeps a reference to the process group object. gloo runs each collective on a
worker thread of the group's C++ object, and that thread drops its last collective's tensors
only after the caller has seen the result; dropping a tensor that Python also knew needs the
GIL. If the group object is still alive when the interpreter shuts down, that thread can ask
for the GIL during finalization, where CPython ends the thread with ``pthread_exit``; the
unwind runs into a noexcept destructor and the process aborts with "terminate called without
an active exception" (SIGABRT, seen under torchrun on a busy 2-core CI machine). Only freeing
the object joins those threads, and ``destroy_process_group`` frees it only when no other
reference is left, so: layers hold ``group=None`` (the default group), torch's
``torch.distributed.nn.functional`` is imported before toolkit creates a group (its
``group=group.WORLD`` defaults would otherwise hold the live group forever; transformers imports
it while a tokenizer is read), and a gloo group toolkit created is destroyed at exit, while the
interpreter is whole, if the caller did not destroy it.
"""
from __future__ import annotations

import atexit
import importlib
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .records import FrozenRecord


class ParallelContext(FrozenRecord):
    """This rank's place in the tensor-parallel group. A hand-written record, not a dataclass: a load
    imports this module (records.py says why)."""

    tp_rank: int
    tp_size: int
    group: Any  # None: the default (world) group, looked up per call, never held (module doc)

    def __init__(self, tp_rank: int = 0, tp_size: int = 1, group: Any = None):
        self.__dict__.update(tp_rank=tp_rank, tp_size=tp_size, group=group)

    @property
    def is_distributed(self) -> bool:
        return self.tp_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` (all ranks get the result)."""
        if self.tp_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


SINGLE = ParallelContext()


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend for a device type: NCCL on CUDA, gloo elsewhere."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_tensor_parallel(*, rank: int, world_size: int, device: torch.device, init_method: str = "env://",
                         timeout: timedelta | None = None) -> ParallelContext:
    """Join (or reuse) the default process group and return this rank's ParallelContext.

    One tensor-parallel group spans the whole world. On CUDA the current device is set to
    ``device`` first, so NCCL binds each rank to its own GPU.

    :param init_method: ``env://`` under a launcher (MASTER_ADDR/MASTER_PORT), ``tcp://host:port`` otherwise
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        options = {"timeout": timeout} if timeout is not None else {}
        _bind_import_time_defaults()
        dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=world_size,
                                **options)
        _destroy_at_exit()
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise RuntimeError(f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                           f"{dist.get_world_size()}, not rank {rank} of {world_size}")
    return ParallelContext(tp_rank=rank, tp_size=world_size)


def shutdown_tensor_parallel() -> None:
    """Leave the default process group if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


# torch modules whose function defaults read ``group.WORLD`` when imported: imported before the
# group exists they hold None (the default group); imported after, the group object itself
_GROUP_DEFAULT_MODULES = ("torch.distributed.nn.functional",)
_exit_hook_registered = False


def _bind_import_time_defaults() -> None:
    for name in _GROUP_DEFAULT_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a torch build without it: nothing there can hold the group either
            pass


def _destroy_at_exit() -> None:
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        atexit.register(_destroy_gloo_group_at_exit)


def _destroy_gloo_group_at_exit() -> None:
    """Join gloo's threads before finalization (module doc) when the caller never destroyed the group.

    Only gloo, where the abort was seen and destroying is local to this process; tearing down an
    NCCL group aborts its communicators, which stays the caller's decision."""
    if dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a single-host rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
