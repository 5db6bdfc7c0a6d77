"""What ``toolkit convert`` produces, without torch: options, the result and its summary, and the
staging that renames the output onto DEST only once complete.

Shared by the driver (convert.py) and the torch-free direct conversions (convert_direct.py).
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import ConversionError
from .permissions import honour_umask


@dataclass(frozen=True)
class ConvertOptions:
    """What ``--to FORMAT[:TYPE]`` and the flags ask of a writer.

    :param target_type: the part after ``:`` (a quant type name the writer knows), None for the writer's default
    :param overrides: per-tensor type overrides, ``(glob on the HF name, type)``, first match wins
    :param tp: tensor-parallel size for writers that store per-rank files
    """

    target_type: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    tp: int = 1
    dtype: torch.dtype | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class ConvertResult:
    dest: Path
    seconds: float
    source_bytes: int
    dest_bytes: int
    num_tensors: int
    num_parameters: int
    facts: dict[str, Any]

    weight_bytes: int = 0  # dest_bytes less config and tokenizer files

    @property
    def bits_per_weight(self) -> float:
        return 8 * (self.weight_bytes or self.dest_bytes) / self.num_parameters if self.num_parameters else 0.0

    def summary_lines(self) -> list[str]:
        return [f"wrote         {self.dest}",
                f"size          {self.source_bytes / 2**20:.1f} MiB -> {self.dest_bytes / 2**20:.1f} MiB"
                f" ({self.weight_bytes / 2**20:.1f} MiB of weights)",
                f"tensors       {self.num_tensors} ({self.num_parameters / 1e6:.2f}M weights, "
                f"{self.bits_per_weight:.2f} bits per weight)",
                f"time          {self.seconds:.2f}s", *fact_lines(self.facts)]


# Facts the lines above already show, in the writer's words.
_SHOWN_FACTS = frozenset({"parameters", "bits_per_weight", "tensors", "files"})
MAX_LIST_LINES = 5  # a long list (e.g. 91 fallbacks) shows this many items, then a count
# Files around the weights that a writer copies along; they are not counted as weight bytes.
SIDECAR_SUFFIXES = frozenset({".json", ".txt", ".model", ".jinja", ".md", ".py", ".tiktoken"})


def fact_lines(facts: dict[str, Any]) -> list[str]:
    """The writer's own facts, one line each, whatever the format: scalars as they are, a mapping
    as ``key count, key count`` (e.g. how many tensors got each type), a list one item per line
    up to MAX_LIST_LINES and then how many more (fallbacks, notes). Empty values are left out."""
    lines = []
    for key, value in facts.items():
        if key in _SHOWN_FACTS or value in (None, "", [], {}):
            continue
        label = f"{key.replace('_', ' '):<13} "
        if isinstance(value, dict):
            lines.append(label + ", ".join(f"{k} {v}" for k, v in value.items()))
        elif isinstance(value, (list, tuple)):
            lines += [label + str(item) for item in value[:MAX_LIST_LINES]]
            if len(value) > MAX_LIST_LINES:
                lines.append(label + f"... and {len(value) - MAX_LIST_LINES} more")
        else:
            lines.append(label + str(value).removeprefix("torch."))  # dtypes read "bfloat16"
    return lines


def parse_target(target: str) -> tuple[str, str | None]:
    fmt, _, kind = target.partition(":")
    return fmt, kind or None


@contextmanager
def staged(dest: Path, force: bool) -> Iterator[Path]:
    """A temporary path beside ``dest``, renamed onto it only if the body completes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    staging = holder / dest.name
    try:
        yield staging
        if not staging.exists():
            raise ConversionError(f"the writer produced nothing at {staging}")
        honour_umask(staging)  # some writers make owner-only files
        if dest.exists() and force:
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        staging.rename(dest)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def size(path: Path, skip_suffixes: frozenset[str] = frozenset()) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.suffix not in skip_suffixes)
