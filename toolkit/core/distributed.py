"""The two ways into a tensor-parallel load (``toolkit.load(..., tp=N)``).

* **Under a launcher** (torchrun sets WORLD_SIZE, RANK, LOCAL_RANK): every rank joins the
  process group and gets a LoadedModel holding its own shard. The caller drives all ranks in
  lockstep (every rank calls ``logits``/``generate`` with the same input).
* **From one process**: N worker processes (fresh interpreters, see tp_process) each load one shard and serve calls; the caller
  gets a ParallelModel whose calls run on every rank. Models and tokenizers stay in the
  workers; only pickled Python values and CPU tensors cross the pipes.

Load progress: only rank 0 reports it (forwarded over its pipe when workers were spawned),
so a progress bar shows one model, not N copies.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import threading
import time
import weakref
from multiprocessing import connection

import torch

from .api import load_on_rank
from .config import LoadConfig
from .load import Progress
from .parallel import free_local_port, init_tensor_parallel
from .tp_process import start_worker
from .tp_worker import (ParallelError, RemoteTraceback, WorkerDiedError, WorkerError, add_note, dumps,
                        rank_device, rebuild_error, send_quietly, to_cpu)

__all__ = ["ParallelError", "ParallelModel", "RemoteTraceback", "WorkerDiedError", "WorkerError", "load_parallel"]

POLL_SECONDS = 0.2  # how often a waiting parent checks that its workers are still alive
_LIVE_HANDLES: "weakref.WeakSet[ParallelModel]" = weakref.WeakSet()


def load_parallel(ref, load_config: LoadConfig, *, tp: int, progress: Progress | None = None):
    """This rank's LoadedModel under a launcher, else a ParallelModel over ``tp`` spawned workers.

    Under a launcher ``tp`` must be 1 (meaning "the whole world") or WORLD_SIZE.
    """
    if "WORLD_SIZE" in os.environ:
        return _load_under_launcher(ref, load_config, tp=tp, progress=progress)
    if tp < 1:
        raise ParallelError(f"tp must be a positive number of processes, got {tp}")
    if load_config.device.type == "cuda" and torch.cuda.device_count() < tp:
        raise ParallelError(f"tp={tp} needs {tp} GPUs (one per worker), {torch.cuda.device_count()} visible")
    return ParallelModel(ref, load_config, tp=tp, progress=progress)


def _load_under_launcher(ref, load_config: LoadConfig, *, tp: int, progress: Progress | None):
    world_size, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", default=rank)
    if tp not in (1, world_size):
        raise ParallelError(f"toolkit.load(tp={tp}) but the launcher started WORLD_SIZE={world_size} processes; "
                            "under torchrun tp must equal the number of processes (or unset WORLD_SIZE to let "
                            "toolkit start its own workers)")
    device = rank_device(load_config.device, local_rank)
    parallel = init_tensor_parallel(rank=rank, world_size=world_size, device=device)
    return load_on_rank(ref, dataclasses.replace(load_config, device=device), parallel,
                        progress if rank == 0 else None)


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ParallelError(f"environment variable {name}={value!r} is not an integer; WORLD_SIZE, RANK and "
                            "LOCAL_RANK are set by a launcher such as torchrun") from None


# ---- the handle over spawned workers ---------------------------------------------------------


class ParallelModel:
    """N worker processes, one tensor-parallel shard each, behind the LoadedModel interface.

    Every call runs on all ranks (their collectives need each other) and returns rank 0's
    result. ``run(fn, ...)`` is the general form: ``fn(local_loaded_model, *args, **kwargs)``
    on every rank, where ``fn`` is a picklable module-level function. A worker's exception
    is re-raised here as its own type (``tp_rank`` set, the remote traceback as ``__cause__``);
    a worker that dies raises WorkerDiedError and shuts the others down instead of hanging.
    Close with ``close()`` or a ``with`` block; ``__del__`` and interpreter exit also close.
    """

    error_grace_seconds = 5.0  # after one rank fails, how long the others may take before we call them stuck

    def __init__(self, ref, load_config: LoadConfig, *, tp: int, progress: Progress | None = None):
        self.tp_size, self._ref, self._load_config = tp, ref, load_config
        self._processes: list = []
        self._conns: list[connection.Connection] = []
        self._closed = False
        self._lock = threading.RLock()
        self._tokenizer, self._has_tokenizer = None, False
        init_method = f"tcp://127.0.0.1:{free_local_port()}"
        try:
            for rank in range(tp):
                self._start_worker(rank, init_method, progress is not None and rank == 0)
            self.config, self.report = self._collect(progress)[0]
        except BaseException as exc:
            self._shutdown(graceful=False)
            if isinstance(exc, WorkerDiedError):
                add_note(exc, "the worker's own error is on its stderr, above")
            raise
        self.report.notes.append(f"tensor parallel over {tp} worker processes; figures are rank 0's")
        _LIVE_HANDLES.add(self)

    def _start_worker(self, rank: int, init_method: str, send_progress: bool) -> None:
        process, conn = start_worker(dict(rank=rank, world_size=self.tp_size, init_method=init_method, ref=self._ref,
                                          load_config=self._load_config, send_progress=send_progress))
        self._processes.append(process)
        self._conns.append(conn)

    # ---- the LoadedModel interface ------------------------------------------------------------
    def logits(self, token_ids) -> torch.Tensor:
        """Logits for every position of one sequence: float32 [len, vocab] on the CPU (gathered on rank 0)."""
        return self.run(_logits, token_ids)

    def generate(self, token_ids, max_new_tokens: int = 32, stop_token_ids=None) -> list[int]:
        """Greedy continuation (new tokens only), the whole loop run in the workers."""
        return self.run(_generate, token_ids, max_new_tokens, stop_token_ids)

    def generate_text(self, prompt: str, max_new_tokens: int = 32) -> str:
        return self.run(_generate_text, prompt, max_new_tokens)

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, read in this process on first use (no weights are read)."""
        if not self._has_tokenizer:
            self._tokenizer, self._has_tokenizer = _read_tokenizer(self._ref, self._load_config), True
        return self._tokenizer

    @property
    def model(self):
        raise AttributeError("a ParallelModel's shards live in its worker processes; reach them with run(fn)")

    # ---- generic primitives -------------------------------------------------------------------
    def run(self, fn, *args, **kwargs):
        """Rank 0's result of ``fn(local_loaded_model, *args, **kwargs)`` run on every rank."""
        return self._call(fn, args, kwargs, wanted_ranks=(0,))[0]

    def run_all(self, fn, *args, **kwargs) -> list:
        """Every rank's result of ``fn(local_loaded_model, *args, **kwargs)``, in rank order."""
        return self._call(fn, args, kwargs, wanted_ranks=None)

    def _call(self, fn, args: tuple, kwargs: dict, *, wanted_ranks: tuple | None) -> list:
        if getattr(fn, "__module__", None) == "__main__":
            raise TypeError(f"run() sends {fn!r} to the workers by module and name, and workers never run the "
                            "calling script (__main__); define the function in an importable module")
        try:
            message = dumps(("call", fn, to_cpu(args), to_cpu(kwargs), wanted_ranks))
        except Exception as exc:
            raise TypeError(f"run() sends {fn!r} and its arguments to the workers by pickle; pass a module-level "
                            f"function and picklable arguments ({exc})") from exc
        with self._lock:  # one call in flight: replies are matched to calls by order
            if self._closed:
                raise ParallelError("this ParallelModel is closed; load the model again")
            self._broadcast(message)
            return self._collect()

    def close(self) -> None:
        """Stop the workers and release their memory (idempotent). Waits up to 10 s for a call in
        flight on another thread, then terminates the workers instead."""
        locked = self._lock.acquire(timeout=10.0)
        try:
            self._shutdown(graceful=locked)
        finally:
            if locked:
                self._lock.release()

    def __enter__(self) -> "ParallelModel":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing sensible to do in a finaliser
                pass

    # ---- pipes ----------------------------------------------------------------------------------
    def _broadcast(self, message: bytes) -> None:
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(message)
            except OSError:
                died = self._died(rank)
                self._shutdown(graceful=False)
                raise died from None
            except BaseException:  # Ctrl-C half way: some ranks got the call, others never will
                self._shutdown(graceful=False)
                raise

    def _collect(self, progress: Progress | None = None) -> list:
        """Each rank's reply in rank order. Raises the lowest rank's error once every rank answered;
        shuts the workers down (pipes out of step, ranks possibly stuck in a collective) when a
        rank dies, when others stay silent ``error_grace_seconds`` after a failure, or on Ctrl-C."""
        replies: dict[int, object] = {}
        errors: dict[int, Exception] = {}
        pending = set(range(len(self._conns)))
        deadline = None
        try:
            while pending:
                self._receive_round(pending, replies, errors, progress)
                if errors and deadline is None:
                    deadline = time.monotonic() + self.error_grace_seconds
                if pending and deadline is not None and time.monotonic() > deadline:
                    raise self._stuck(pending, errors)
        except BaseException:
            if pending:
                self._shutdown(graceful=False)
            raise
        if errors:
            raise errors[min(errors)]
        return [replies[rank] for rank in sorted(replies)]

    def _receive_round(self, pending: set, replies: dict, errors: dict, progress: Progress | None) -> None:
        conns = {self._conns[rank]: rank for rank in pending}
        sentinels = {self._processes[rank].sentinel: rank for rank in pending
                     if self._processes[rank].sentinel is not None}
        ready = connection.wait([*conns, *sentinels], timeout=POLL_SECONDS)
        for conn in (item for item in ready if item in conns):
            rank = conns[conn]
            try:
                raw = conn.recv_bytes()
            except (EOFError, OSError):  # EOF or connection reset: the worker is gone
                raise self._died(rank) from None
            try:
                kind, payload = pickle.loads(raw)
            except Exception as exc:  # noqa: BLE001 - a reply this process cannot unpickle
                kind, payload = "error", (None, type(exc).__name__, f"reply could not be unpickled: {exc}", "")
            if kind == "progress":
                if progress is not None:
                    progress(*payload)
                continue
            pending.discard(rank)
            if kind == "error":
                errors[rank] = rebuild_error(rank, *payload)
            else:
                replies[rank] = payload
        for sentinel in (item for item in ready if item in sentinels):
            rank = sentinels[sentinel]
            if rank in pending and not self._conns[rank].poll():  # exited with nothing left to read
                raise self._died(rank)

    def _died(self, rank: int) -> WorkerDiedError:
        process = self._processes[rank]
        process.join(timeout=1.0)
        return WorkerDiedError(f"tensor-parallel worker rank {rank} (pid {process.pid}) exited with code "
                               f"{process.exitcode} without answering; all workers were shut down", rank=rank)

    def _stuck(self, pending: set, errors: dict) -> Exception:
        first = errors[min(errors)]
        note = (f"ranks {sorted(pending)} did not answer within {self.error_grace_seconds}s after rank "
                f"{min(errors)} failed (probably waiting in a collective); all workers were shut down")
        add_note(first, note)
        return first

    def _shutdown(self, *, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE_HANDLES.discard(self)
        if graceful:
            for conn in self._conns:
                send_quietly(conn, ("close", None, (), {}, None))
        deadline = time.monotonic() + (10.0 if graceful else 0.0)
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        for process in self._processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self._conns:
            conn.close()
        for process in self._processes:
            process.close()


def _logits(loaded, token_ids):
    return loaded.logits(token_ids)  # the worker's reply moves it to the CPU (tp_worker.to_cpu)


def _generate(loaded, token_ids, max_new_tokens, stop_token_ids):
    return loaded.generate(token_ids, max_new_tokens, stop_token_ids)


def _generate_text(loaded, prompt, max_new_tokens):
    return loaded.generate_text(prompt, max_new_tokens)


def _read_tokenizer(ref, load_config: LoadConfig):
    from .load import _tokenizer, open_checkpoint  # noqa: PLC0415 - only when the caller asks for it
    from .registry import default_registry  # noqa: PLC0415
    from .report import LoadReport  # noqa: PLC0415

    checkpoint = open_checkpoint(ref, registry=default_registry(), load_config=load_config, report=LoadReport())
    try:
        return _tokenizer(checkpoint, load_config)
    finally:
        checkpoint.close()


@atexit.register
def _close_live_handles() -> None:
    """Runs before multiprocessing's own exit hook (registered earlier), so workers stop cleanly."""
    for handle in list(_LIVE_HANDLES):
        handle.close()
