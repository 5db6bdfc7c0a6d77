"""``toolkit convert``: any readable format -> any writable format, through loader plugins.

Two writer kinds, both part of the Loader contract:

* streaming: ``loader.writer(dest, options) -> TensorWriter`` receives the source as
  Hugging Face-named dense tensors one at a time (``begin`` / ``add_tensor`` / ``finish``), so
  a conversion between two tensor-file formats never holds the model;
* model-level: ``loader.save(loaded_model, dest, options)`` writes a model toolkit loaded
  (per-rank snapshots, serializers and pre-quantized layouts that need the model's own parameters).

Output goes to a temporary sibling of DEST and is renamed only once complete: an
interrupted or failed conversion leaves nothing at DEST.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from .config import LoadConfig
from .convert_output import (MAX_LIST_LINES, SIDECAR_SUFFIXES, ConvertOptions, ConvertResult,  # noqa: F401
                             fact_lines, parse_target, size as _size, staged as _staged)
from .errors import ConversionError, UnknownNameError
from .experts import expert_tensor_name
from .load import open_checkpoint, read_config
from .names import NameContext
from .registry import Registry, default_registry
from .report import LoadReport

Progress = Callable[[int, int, str], None]


class TensorWriter(Protocol):
    """Optional: ``copies_tokenizer(checkpoint) -> bool``. True means the writer takes the source's
    tokenizer from the checkpoint as stored (a source of its own format), so the driver builds no
    tokenizer object and ``begin`` gets ``tokenizer=None``."""

    def begin(self, *, hf_config: dict, tokenizer: Any | None, num_tensors: int) -> None: ...

    def add_tensor(self, hf_name: str, tensor: torch.Tensor) -> None:
        """A dense tensor under its Hugging Face name (q/k/v and gate/up separate)."""

    def finish(self) -> dict[str, Any]:
        """Close the output; return summary facts (e.g. ``{"parameters": n, "bits": b}``)."""


def convert(source, dest, *, to: str, force: bool = False, options: ConvertOptions | None = None,
            source_format: str | None = None, progress: Progress | None = None,
            registry: Registry | None = None) -> ConvertResult:
    """Convert ``source`` into ``dest`` as ``to`` (``FORMAT[:TYPE]``); see the module docstring."""
    registry = registry or default_registry()
    fmt, kind = parse_target(to)
    loader = registry.loader(fmt)
    if not (hasattr(loader, "writer") or hasattr(loader, "save")):
        raise UnknownNameError("writer", fmt, [n for n, l in registry.loaders.items()
                                               if hasattr(l, "writer") or hasattr(l, "save")])
    options = options or ConvertOptions()
    options = ConvertOptions(kind or options.target_type, options.overrides, options.tp, options.dtype, options.extra)
    dest = Path(dest)
    if dest.exists() and not force:
        raise ConversionError(f"{dest} exists; pass --force to overwrite it")
    start = time.perf_counter()
    with _staged(dest, force) as staging:
        if hasattr(loader, "writer"):
            facts, stats = _stream(source, staging, loader, options, source_format, registry, progress)
        else:
            facts, stats = _save_model(source, staging, loader, options, source_format)
    return ConvertResult(dest, time.perf_counter() - start, stats[0], _size(dest), stats[1], stats[2], facts,
                         weight_bytes=_size(dest, skip_suffixes=SIDECAR_SUFFIXES))


def _stream(source, staging: Path, loader, options: ConvertOptions, source_format, registry: Registry,
            progress: Progress | None):
    report = LoadReport()
    checkpoint = open_checkpoint(source, registry=registry, load_config=LoadConfig(format=source_format),
                                 report=report)
    try:
        hf = checkpoint.hf_config
        arch, config = read_config(checkpoint, registry)
        name_map = registry.name_map(checkpoint.format, arch.name)
        context = NameContext(arch, config, _parameter_names(arch, config, checkpoint, registry))
        writer = loader.writer(staging, options)
        copies = getattr(writer, "copies_tokenizer", None)
        tokenizer = None if copies is not None and copies(checkpoint) else checkpoint.tokenizer()
        writer.begin(hf_config=hf, tokenizer=tokenizer, num_tensors=len(checkpoint.tensor_names()))
        stats = _copy_tensors(checkpoint, name_map, context, writer, progress)
        return writer.finish(), (report.bytes_read + stats[0], stats[1], stats[2])
    finally:
        checkpoint.close()


def _copy_tensors(checkpoint, name_map, context: NameContext, writer, progress: Progress | None):
    total, source_bytes, count, numel = len(checkpoint.tensor_names()), 0, 0, 0
    for done, (name, _file, tensor) in enumerate(checkpoint.read_tensors(), start=1):
        source_bytes += int(getattr(tensor, "nbytes", 0))
        mapped = name_map.map(name, context)
        if mapped is not None:
            value = mapped.transform(tensor) if mapped.transform else tensor
            dense = to_dense(value, name)
            name = unpacked_name(mapped.canonical, mapped.shard_id, context.arch.packed_modules)
            writer.add_tensor(expert_tensor_name(name, mapped.expert_id), dense)
            count, numel = count + 1, numel + dense.numel()
        if progress is not None:
            progress(done, total, name)
    return source_bytes, count, numel


def to_dense(value, name: str) -> torch.Tensor:
    """A plain float tensor: format objects (packed quantized data) provide ``to_dense()``."""
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "to_dense"):
        return value.to_dense()
    raise ConversionError(f"tensor {name!r} ({type(value).__name__}) cannot be dequantized for conversion")


def unpacked_name(canonical: str, shard_id: int | None, packed_modules) -> str:
    """Inverse of ``split_packed``: (``...qkv_proj.weight``, 1) -> ``...k_proj.weight``."""
    if shard_id is None:
        return canonical
    parts = canonical.split(".")
    for i, part in enumerate(parts):
        if part in packed_modules:
            parts[i] = packed_modules[part][shard_id]
            return ".".join(parts)
    raise ConversionError(f"{canonical!r} has shard {shard_id} but no packed module")


def _parameter_names(arch, config, checkpoint, registry: Registry) -> frozenset[str]:
    """Our own model's parameter names, from a build on the meta device (no memory, no weights)."""
    from .quant import DEFAULT_SCHEME  # noqa: PLC0415

    scheme = registry.quant_scheme(DEFAULT_SCHEME).from_spec(DEFAULT_SCHEME, params_dtype=torch.float32)
    with torch.device("meta"):
        model = arch.build(config, scheme, _single())
    return frozenset(name for name, _ in model.named_parameters())


def _single():
    from .parallel import SINGLE  # noqa: PLC0415

    return SINGLE


def _save_model(source, staging: Path, loader, options: ConvertOptions, source_format):
    from .api import load  # noqa: PLC0415 - model-level writers need the model loaded

    quant = getattr(loader, "quant_for_target", lambda kind: None)(options.target_type)
    dtype = options.dtype or _source_dtype(source, source_format)
    loaded = load(source, format=source_format, quant=quant, dtype=dtype, device="cpu", tp=options.tp)
    try:
        facts = loader.save(loaded, staging, options) or {}
        report = loaded.report
        return facts, (report.bytes_read, report.tensors_mapped, report.num_parameters)
    finally:
        loaded.close()


def _source_dtype(source, source_format) -> torch.dtype | None:
    """A 16-bit source stays 16-bit in a model-level writer's unquantized tensors (embeddings,
    norms, skipped layers), instead of doubling in fp32; anything else loads at the default."""
    checkpoint = open_checkpoint(source, registry=default_registry(), load_config=LoadConfig(format=source_format),
                                 report=LoadReport())
    try:
        name = checkpoint.hf_config.get("torch_dtype") or checkpoint.hf_config.get("dtype")
    finally:
        checkpoint.close()
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name).removeprefix("torch."))
