"""Resolve a model reference to local files: a file, a directory, or a Hugging Face hub id.

``org/repo`` and ``org/repo:QUANT`` go through huggingface_hub's ``snapshot_download``
(which honours ``HF_HUB_OFFLINE`` and the local cache); ``:QUANT`` restricts the download to
files whose name contains QUANT (the usual layout of single-format repos).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .checkpoint import Source
from .errors import SourceError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")


def resolve(reference: str | os.PathLike) -> Source:
    """Local path if it exists, else a hub id; SourceError when neither works."""
    text = str(reference)
    path = Path(text).expanduser()
    if path.exists():
        return _local(text, path)
    if _HUB_ID.match(text) and not text.startswith((".", "/")):
        return _from_hub(text)
    raise SourceError(f"model {text!r} is neither an existing file or directory nor a hub repo id (org/name)")


def _local(reference: str, path: Path) -> Source:
    if path.is_dir():
        files = tuple(sorted(p for p in path.iterdir() if p.is_file()))
        if not files:
            raise SourceError(f"directory {path} is empty")
        return Source(reference, path.resolve(), files)
    return Source(reference, path.resolve(), (path.resolve(),))


def _from_hub(reference: str) -> Source:
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - only hub references need it
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError  # noqa: PLC0415

    repo_id, _, hint = reference.partition(":")
    patterns = [f"*{hint}*", "*.json", "*.model", "*.txt"] if hint else None
    try:
        folder = snapshot_download(repo_id, allow_patterns=patterns)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        offline = " (HF_HUB_OFFLINE is set and it is not cached)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise SourceError(f"could not fetch {repo_id!r} from the hub{offline}: {exc}") from exc
    source = _local(reference, Path(folder))
    return Source(reference, source.path, source.files, hint or None)
