"""Write a directory under a temporary name next to DEST and rename it into place only when
every tensor-parallel rank finished; otherwise remove it. DEST never exists half-written.

All ranks call :func:`write_staged` together (it runs collectives); rank 0 owns the directory:
it creates the staging directory, runs ``finalize`` (merging what the ranks wrote) and renames.
Every step ends with an agreement (an all-reduce of failure flags), so one rank failing
makes all of them stop instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, TypeVar

import torch

from toolkit.core.errors import ConversionError

T = TypeVar("T")


def staging_path(dest: Path) -> Path:
    """Deterministic (every rank computes the same one), hidden, in DEST's own parent (same filesystem)."""
    return dest.parent / f".{dest.name}.partial"


def write_staged(dest, parallel, device: torch.device, write_rank: Callable[[Path], T],
                 finalize: Callable[[Path], None], *, overwrite: bool = False) -> T:
    """Run ``write_rank(staging)`` on every rank, then ``finalize(staging)`` on rank 0, then publish.

    :param overwrite: replace an existing DEST (after the new one is complete); else refuse it
    :returns: this rank's ``write_rank`` result
    """
    dest = Path(dest).absolute()
    staging, is_leader = staging_path(dest), parallel.tp_rank == 0
    _step(parallel, device, staging, is_leader and _prepare, dest, staging, overwrite)
    result = _step(parallel, device, staging, write_rank, staging)
    _step(parallel, device, staging, is_leader and finalize, staging)
    _step(parallel, device, staging, is_leader and _publish, staging, dest)
    return result


def _step(parallel, device, staging: Path, action, *args):
    """``action(*args)`` (skipped when falsy), then agree with the other ranks; clean up if anyone failed."""
    result, error = None, None
    try:
        if action:
            result = action(*args)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the other ranks know
        error = exc
    failed = _count_failures(parallel, device, error is not None)
    if failed:
        if parallel.tp_rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        if error is not None:
            raise error
        raise ConversionError(f"saving was abandoned: {failed} other tensor-parallel rank(s) failed")
    return result


def _count_failures(parallel, device: torch.device, failed: bool) -> int:
    flag = torch.tensor([1.0 if failed else 0.0], device=device)
    return int(parallel.all_reduce(flag).item())


def _prepare(dest: Path, staging: Path, overwrite: bool) -> None:
    if dest.exists() and not overwrite:
        raise ConversionError(f"{dest} already exists (pass overwrite=True / --force to replace it)")
    shutil.rmtree(staging, ignore_errors=True)  # left over from a crashed earlier save
    staging.mkdir(parents=True)


def _publish(staging: Path, dest: Path) -> None:
    if not dest.exists():
        staging.rename(dest)
        return
    old = dest.parent / f".{dest.name}.replaced"
    shutil.rmtree(old, ignore_errors=True)  # only the new DEST is complete; the old one goes last
    dest.rename(old)
    staging.rename(dest)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()
