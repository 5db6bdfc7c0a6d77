"""Run fuzz cases, each load in a forked child with a time limit and a memory limit, and classify.

Outcomes:

* ``loaded``: ``toolkit.load`` succeeded and a 3-token forward pass ran;
* ``typed``: a ToolkitError (``names_file`` says whether its message names a file of the case);
* ``untyped``: any other exception, during the load or in the forward pass after it;
* ``alloc``: the memory limit was hit (MemoryError, or torch's allocator refusing);
* ``hang``: the child used more than ``timeout`` seconds of CPU (killed by RLIMIT_CPU), or did not
  finish within ``wall_limit`` seconds of wall-clock time (a deadlock). CPU time, not wall time,
  is what "past 10 s" means here: on a shared machine a niced child can wait many seconds for a
  core without doing any work;
* ``crash``: the child died of a signal (segfault, abort) without reporting.

The child is forked from a process that already imported torch and toolkit, so a case costs
the load itself, not the imports. ``run_cases`` spreads cases over worker processes.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import resource
import select
import shutil
import signal
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from fuzz_mutations import Case, make_case

OUTCOMES = ("loaded", "typed", "untyped", "hang", "crash", "alloc")
BAD = ("untyped", "hang", "crash", "alloc")
ALLOCATOR_MESSAGES = ("can't allocate memory", "not enough memory", "DefaultCPUAllocator", "std::bad_alloc")


@dataclass
class Result:
    seed: int
    case_id: int
    kind: str
    mutation: str
    outcome: str
    detail: str = ""
    names_file: bool | None = None
    seconds: float = 0.0


def attempt(case: Case) -> tuple[str, str, bool | None]:
    """Load ``case.path`` and run a forward pass, in this process; (outcome, detail, names_file)."""
    import toolkit  # noqa: PLC0415
    from toolkit.core.errors import ToolkitError  # noqa: PLC0415

    stage = "load"
    try:
        loaded = toolkit.load(str(case.path), device="cpu")
        stage = "forward"
        vocab = int(loaded.config.vocab_size)
        loaded.logits([i % vocab for i in range(3)])
        return "loaded", "", None
    except ToolkitError as exc:
        text = f"{type(exc).__name__}: {exc}"
        return "typed", text[:600], case.folder.name in text
    except MemoryError as exc:
        return "alloc", f"{stage}: MemoryError {exc}"[:600], None
    except BaseException as exc:  # noqa: BLE001 - classifying everything is the point
        text = f"{stage}: {type(exc).__name__}: {exc}"
        if any(message in str(exc) for message in ALLOCATOR_MESSAGES):
            return "alloc", text[:600], None
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
        return "untyped", f"{text[:500]} [{where}]", None


def run_isolated(case: Case, *, timeout: float = 10.0, memory_bytes: int = 2 << 30,
                 wall_limit: float | None = None) -> Result:
    """``attempt(case)`` in a forked child under RLIMIT_AS (current size + ``memory_bytes``),
    RLIMIT_CPU (``timeout`` seconds) and a wall-clock limit (default: 12 x ``timeout``, at least 60 s)."""
    wall_limit = wall_limit if wall_limit is not None else max(12 * timeout, 60.0)
    read_end, write_end = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        try:
            _limit_memory(memory_bytes)
            cpu = max(1, int(timeout + 0.999))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            outcome = attempt(case)
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    payload, outcome = _collect(pid, read_end, wall_limit)
    seconds = time.monotonic() - started
    result = Result(case.seed, case.case_id, case.kind, case.mutation, outcome, seconds=round(seconds, 3))
    if outcome in (f"crash:signal {int(signal.SIGXCPU)}", f"crash:signal {int(signal.SIGKILL)}") and \
            seconds >= timeout:
        result.outcome, result.detail = "hang", f"killed after {timeout:.0f} s of CPU time"
    if outcome == "reported":
        result.outcome, result.detail, result.names_file = json.loads(payload)
    return result


def _limit_memory(extra: int) -> None:
    with open("/proc/self/status") as status:
        size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = size_kb * 1024 + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _collect(pid: int, read_end: int, timeout: float) -> tuple[bytes, str]:
    deadline, chunks = time.monotonic() + timeout, []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return b"", "hang:wall"
            ready, _, _ = select.select([read_end], [], [], remaining)
            if ready:
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(read_end)
    if chunks:
        return b"".join(chunks), "reported"
    if os.WIFSIGNALED(status):
        return b"", f"crash:signal {os.WTERMSIG(status)}"
    return b"", "crash:no report"


# ---- many cases --------------------------------------------------------------------------------------
_STATE: dict = {}


def _init_worker(seed: int, seeds: dict, workdir: str, timeout: float, memory_bytes: int, keep: bool) -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    _STATE.update(seed=seed, seeds={k: Path(v) for k, v in seeds.items()}, workdir=Path(workdir), timeout=timeout,
                  memory_bytes=memory_bytes, keep=keep)


def _run_one(case_id: int) -> dict:
    state = _STATE
    try:
        case = make_case(state["seed"], case_id, state["seeds"], state["workdir"])
    except Exception as exc:  # noqa: BLE001 - a mutation the engine could not make: reported, never hidden
        return asdict(Result(state["seed"], case_id, "?", "mutation failed", "untyped",
                             f"fuzzer: {type(exc).__name__}: {exc}"))
    result = run_isolated(case, timeout=state["timeout"], memory_bytes=state["memory_bytes"])
    if result.outcome.startswith(("crash", "hang:")):
        result.detail, result.outcome = result.outcome, result.outcome.split(":")[0]
    if not (state["keep"] and result.outcome in BAD):
        shutil.rmtree(case.folder, ignore_errors=True)
    return asdict(result)


def warm_up(seeds: dict[str, Path]) -> None:
    """Load every seed once here, so the forked children find every lazy import (bitsandbytes,
    tensorizer, transformers' tokenizers) done and each case costs only its own load."""
    import torch  # noqa: PLC0415

    import toolkit  # noqa: PLC0415

    torch.set_num_threads(1)
    for path in seeds.values():
        toolkit.load(str(path), device="cpu").logits([0, 1, 2])


def run_cases(seed: int, case_ids, seeds: dict[str, Path], workdir: Path, *, workers: int = 2,
              timeout: float = 10.0, memory_bytes: int = 2 << 30, keep: bool = False, on_result=None) -> list[Result]:
    """Every case in ``case_ids``, over ``workers`` forked processes; results in completion order."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    warm_up(seeds)
    init = (seed, {k: str(v) for k, v in seeds.items()}, str(workdir), timeout, memory_bytes, keep)
    results = []
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=_init_worker, initargs=init) as pool:
        for raw in pool.imap_unordered(_run_one, list(case_ids), chunksize=4):
            result = Result(**raw)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def counts(results: list[Result]) -> dict[str, int]:
    table = {outcome: 0 for outcome in OUTCOMES}
    for result in results:
        table[result.outcome] = table.get(result.outcome, 0) + 1
    return table
