"""The worker side of a spawned tensor-parallel group, what crosses its pipes, and its errors.

A worker loads one shard (``load_on_rank``) and answers ``("call", fn, args, kwargs)``
messages with ``fn(loaded_model, *args, **kwargs)`` until told to close or until its
parent goes away. Messages are plain pickles (tensors by value, moved to CPU); an
exception travels as its class, args and attributes plus its formatted traceback, so the
parent can rebuild it as its own type (``rebuild_error``, used by ``distributed.ParallelModel``).
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import traceback
from multiprocessing import connection

import torch

from .api import load_on_rank
from .config import LoadConfig
from .errors import ToolkitError
from .parallel import init_tensor_parallel, shutdown_tensor_parallel


class ParallelError(ToolkitError):
    """A tensor-parallel setup that cannot work (sizes, devices, launcher environment, closed handle)."""


class WorkerError(ParallelError):
    """A worker failed in a way that has no better type here; carries the rank and the remote traceback."""

    def __init__(self, message: str, *, rank: int | None = None, remote_traceback: str = ""):
        super().__init__(message)
        self.rank, self.remote_traceback = rank, remote_traceback


class WorkerDiedError(WorkerError):
    """A worker process exited without answering (crash, signal, out of memory)."""


class RemoteTraceback(Exception):
    """The worker's formatted traceback, attached as ``__cause__`` of an error re-raised in the parent."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


def rank_device(device: torch.device, index: int) -> torch.device:
    """Rank ``index``'s device: its own GPU on CUDA (any index the caller gave is replaced)."""
    return torch.device("cuda", index) if device.type == "cuda" else device


def worker_main(rank: int, world_size: int, init_method: str, ref, load_config: LoadConfig,
                conn: connection.Connection, send_progress: bool) -> None:
    """Entry point of a spawned worker: load this rank's shard, then serve calls until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    try:
        loaded = _load_shard(rank, world_size, init_method, ref, load_config, conn if send_progress else None)
        conn.send_bytes(dumps(("ready", (loaded.config, loaded.report))))
    except BaseException as exc:  # noqa: BLE001 - every load failure goes back to the parent
        send_quietly(conn, _error_reply(exc))
        return
    try:
        _serve(loaded, conn)
    finally:
        shutdown_tensor_parallel()


def _load_shard(rank, world_size, init_method, ref, load_config: LoadConfig, progress_conn):
    if load_config.device.type == "cpu":  # N workers share the cores instead of each taking all of them
        torch.set_num_threads(max(1, _num_cpus() // world_size))
    device = rank_device(load_config.device, rank)
    parallel = init_tensor_parallel(rank=rank, world_size=world_size, device=device, init_method=init_method)
    progress = _progress_sender(progress_conn) if progress_conn is not None else None
    return load_on_rank(ref, dataclasses.replace(load_config, device=device), parallel, progress)


def _progress_sender(conn: connection.Connection):
    def progress(done: int, total: int, name: str) -> None:
        conn.send_bytes(dumps(("progress", (done, total, name))))

    return progress


def _num_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _serve(loaded, conn: connection.Connection) -> None:
    """Answer ``("call", fn, args, kwargs, wanted_ranks)`` with fn(loaded, ...) until ``close`` or the
    parent goes away. Every rank runs ``fn``; ranks not in ``wanted_ranks`` (None: all) reply None,
    so a large result crosses one pipe, not N."""
    rank = loaded.parallel.tp_rank
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone: nobody is left to answer
        try:
            kind, fn, args, kwargs, wanted_ranks = pickle.loads(raw)
            if kind == "close":
                return
            result = fn(loaded, *args, **kwargs)
            reply = dumps(("ok", to_cpu(result) if wanted_ranks is None or rank in wanted_ranks else None))
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, the worker keeps serving
            reply = dumps(_error_reply(exc))
        conn.send_bytes(reply)


def to_cpu(value):
    """Tensors (also inside plain lists, tuples and dicts) detached, on CPU, owning only their own bytes."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        # pickle writes a view's whole storage; copy out the part we mean to send
        return tensor.clone() if tensor.untyped_storage().nbytes() > tensor.nbytes else tensor
    if type(value) in (list, tuple):
        return type(value)(to_cpu(item) for item in value)
    if type(value) is dict:
        return {key: to_cpu(item) for key, item in value.items()}
    return value


def dumps(message) -> bytes:
    """Plain pickle, not multiprocessing's: tensors travel by value, never as shared-memory handles."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _error_reply(exc: BaseException) -> tuple:
    """The exception's class, args and attributes (rebuilt without calling ``__init__``) plus its text."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        state = pickle.dumps((type(exc), exc.args, dict(vars(exc))), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reaches the parent as text
        state = None
    return ("error", (state, f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), text))


def send_quietly(conn: connection.Connection, message) -> None:
    try:
        conn.send_bytes(dumps(message))
    except (OSError, ValueError):
        pass  # parent already gone


def rebuild_error(rank: int, state: bytes | None, type_name: str, message: str, text: str) -> Exception:
    """The worker's exception as its own type where possible, else a WorkerError; names the rank."""
    exc = None
    if state is not None:
        try:
            cls, args, attributes = pickle.loads(state)
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(attributes)
        except Exception:  # noqa: BLE001 - class not importable here, odd constructor, ...
            exc = None
    if not isinstance(exc, Exception):  # never re-raise a worker's SystemExit/KeyboardInterrupt here
        exc = WorkerError(f"tensor-parallel rank {rank} raised {type_name}: {message}", rank=rank,
                          remote_traceback=text)
    exc.tp_rank = rank
    exc.__cause__ = RemoteTraceback(text)
    add_note(exc, f"(raised on tensor-parallel rank {rank}; its traceback is shown above)")
    return exc


def add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: kept for callers, not printed
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]
