"""The load pipeline. Nothing here knows a format, scheme or architecture by name.

reference -> Source -> Loader.open -> Checkpoint -> ModelArch.config_from -> QuantScheme
-> ModelArch.build -> stream tensors through the NameMap into self-sharding parameters
-> QuantScheme.process_after_loading -> LoadedModel
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from . import source as sources
from .checkpoint import Checkpoint, Source
from .config import LoadConfig, ModelConfig
from .config_checks import check_hf_config, check_model_config
from .errors import (CheckpointError, InvalidConfigError, MissingTensorError, OptionError, ShapeMismatchError,
                     SourceError, UnexpectedTensorError, UnknownNameError)
from .gc_pause import collector_paused
from .names import MappedName, NameContext
from .parallel import SINGLE, ParallelContext
from .quant import DEFAULT_SCHEME, QuantScheme
from .registry import Registry, default_registry
from .release import release
from .report import LoadReport
from .tensor_checks import check_against_checkpoint
from .transfer import staged_copies

Progress = Callable[[int, int, str], None]  # (done, total, tensor name)


def pick_loader(registry: Registry, source: Source, fmt: str | None):
    """The named loader, or the one most confident it reads ``source``."""
    if fmt is not None:
        return registry.loader(fmt)
    scored = [(loader.detect(source), name, loader) for name, loader in registry.loaders.items()]
    scored = [entry for entry in scored if entry[0]]
    if not scored:
        raise SourceError(f"no loader recognises {source.path}; installed loaders: {', '.join(registry.loaders)}"
                          " (pass --format to force one)")
    return max(scored, key=lambda entry: entry[0])[2]


def default_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """fp32 on CPU (fast and exact there); the checkpoint's own 16-bit dtype on accelerators."""
    if device.type == "cpu":
        return torch.float32
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(str(config.torch_dtype), torch.bfloat16)


def config_file(checkpoint: Checkpoint) -> str:
    """The file a checkpoint's config came from (its ``config_file``, else its first file)."""
    return str(getattr(checkpoint, "config_file", None) or checkpoint.files[0])


# What an architecture's config_from may raise on a value config_checks let through; reported
# as an InvalidConfigError naming the file, never as the bare exception.
CONFIG_READ_ERRORS = (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError, AttributeError)


def read_config(checkpoint: Checkpoint, registry: Registry):
    """The checkpoint's architecture and its checked ModelConfig; every failure names the config's file."""
    file = config_file(checkpoint)
    hf = check_hf_config(checkpoint.hf_config, file=file)
    try:
        arch = registry.architecture(*(hf.get("architectures") or []), hf.get("model_type"))
    except UnknownNameError as exc:
        raise exc.at_file(file) from None
    try:
        config = arch.config_from(hf)
    except CheckpointError as exc:
        raise exc.located(file=file) from exc
    except CONFIG_READ_ERRORS as exc:
        raise InvalidConfigError(f"the {arch.name} config cannot be read: {type(exc).__name__}: {exc}",
                                 file=file) from exc
    return arch, check_model_config(config, file=file)


def choose_scheme(registry: Registry, checkpoint: Checkpoint, quant: str | None, dtype: torch.dtype) -> QuantScheme:
    file = config_file(checkpoint)
    try:
        if checkpoint.quant_scheme is not None:
            if quant is not None and quant.split(":")[0] != checkpoint.quant_scheme:
                raise CheckpointError(f"checkpoint is already quantized as {checkpoint.quant_scheme!r}; "
                                      f"--quant {quant} cannot be applied on top", file=str(checkpoint.files[0]))
            factory = registry.quant_scheme(checkpoint.quant_scheme)
            return factory.from_checkpoint(checkpoint.quant_metadata, params_dtype=dtype)
        spec = quant or DEFAULT_SCHEME
        return registry.quant_scheme(spec.split(":")[0]).from_spec(spec, params_dtype=dtype)
    except UnknownNameError as exc:
        raise exc.at_file(file) from None
    except CheckpointError as exc:
        raise exc.located(file=file) from exc


def stream_weights(model: nn.Module, checkpoint: Checkpoint, name_map, context: NameContext, report: LoadReport,
                   progress: Progress | None = None) -> None:
    """Read each tensor once, map its name, and let the owning layer place its rank's shard."""
    total = len(checkpoint.tensor_names())
    for done, (name, file, tensor) in enumerate(checkpoint.read_tensors(), start=1):
        report.bytes_read += int(getattr(tensor, "nbytes", 0))
        mapped = name_map.map(name, context)
        if mapped is None:
            report.tensors_skipped += 1
        else:
            _place(model, mapped, tensor, context, file=file, tensor_name=name)
            report.tensors_mapped += 1
        if progress is not None:
            progress(done, total, name)


def _place(model: nn.Module, mapped: MappedName, tensor, context: NameContext, *, file: str, tensor_name: str) -> None:
    if mapped.canonical not in context.parameter_names:
        raise UnexpectedTensorError(f"no model parameter takes this tensor (mapped to {mapped.canonical!r})",
                                    file=file, tensor=tensor_name)
    module_name, _, param_name = mapped.canonical.rpartition(".")
    module = model.get_submodule(module_name)
    value = mapped.transform(tensor) if mapped.transform else tensor
    try:
        if mapped.stored_part is not None:
            _load_stored(getattr(module, param_name), value, mapped.stored_part)
        elif mapped.expert_id is not None:
            _load_expert(module, param_name, value, mapped)
        elif hasattr(module, "load_weight"):
            module.load_weight(param_name, value, mapped.shard_id)
        else:
            getattr(module, param_name).load_replicated(value)
    except CheckpointError as exc:
        raise exc.located(file=file, tensor=tensor_name) from exc
    except PLACE_ERRORS as exc:  # a value the checks before the build did not foresee; still named
        raise ShapeMismatchError(f"cannot place this tensor into {mapped.canonical!r}: {type(exc).__name__}: {exc}",
                                 file=file, tensor=tensor_name) from exc


# What a layer's loader or a name map's transform raises on a tensor of an unforeseen shape or type
PLACE_ERRORS = (RuntimeError, ValueError, IndexError, ZeroDivisionError, TypeError)


def _load_expert(module: nn.Module, param_name: str, value, mapped: MappedName) -> None:
    if not hasattr(module, "load_expert_weight"):
        raise CheckpointError(f"{mapped.canonical} is not an expert parameter, but the tensor holds expert "
                              f"{mapped.expert_id}")
    module.load_expert_weight(param_name, value, shard_id=mapped.shard_id, expert_id=mapped.expert_id)


def _load_stored(param, value, part: str) -> None:
    if not hasattr(param, "load_stored"):
        raise CheckpointError(f"a {type(param).__name__} cannot take a stored state (no load_stored)")
    param.load_stored(value, part=part)


def check_complete(model: nn.Module, checkpoint: Checkpoint) -> None:
    for name, param in model.named_parameters():
        missing = param.missing_shards() if hasattr(param, "missing_shards") else set()
        if missing:
            shards = "" if missing == {None} else f" (shards {sorted(missing)})"
            raise MissingTensorError(f"model parameter {name!r}{shards} was not provided by the checkpoint",
                                     file=str(checkpoint.files[0]), tensor=name)


def finish(model: nn.Module) -> None:
    """Let each layer's scheme process its weights, except layers filled from a stored state
    (``load_stored``), which were saved already processed."""
    for module in model.modules():
        scheme = module.__dict__.get("scheme")
        if scheme is not None and not _is_stored(module):
            scheme.process_after_loading(module)
    model.eval()


def _is_stored(module: nn.Module) -> bool:
    params = list(module.parameters(recurse=False))
    return bool(params) and all(getattr(param, "is_stored", False) for param in params)


def load_checkpoint(checkpoint: Checkpoint, *, registry: Registry, load_config: LoadConfig, report: LoadReport,
                    parallel: ParallelContext = SINGLE, progress: Progress | None = None):
    """Build the model a checkpoint describes and fill it; returns (model, arch, config, scheme)."""
    with report.phase("build"):
        arch, config = read_config(checkpoint, registry)
        config = with_expert_parallel(config, load_config.expert_parallel)
        name_map = _name_map(registry, checkpoint, arch)
        # refused here, before build allocates anything the config implies
        check_against_checkpoint(config, checkpoint, name_map, NameContext(arch, config, frozenset()),
                                 file=config_file(checkpoint), tp_size=parallel.tp_size)
        # a checkpoint holding in-memory state (stored_state) pins the dtype it was saved at
        dtype = (load_config.dtype or getattr(checkpoint, "params_dtype", None)
                 or default_dtype(config, load_config.device))
        scheme = choose_scheme(registry, checkpoint, load_config.quant, dtype)
        model = _build(arch, config, scheme, parallel, load_config.device, config_file(checkpoint))
    report.architecture, report.scheme = arch.name, scheme.name
    context = NameContext(arch, config, frozenset(name for name, _ in model.named_parameters()))
    with report.phase("load_weights"), staged_copies(load_config.device):  # every copy done when it ends
        stream_weights(model, checkpoint, name_map, context, report, progress)
    with report.phase("finish"):
        check_complete(model, checkpoint)
        finish(model)
    report.notes.extend(getattr(scheme, "notes", []))  # what a scheme wants the user to know (e.g. re-quantized)
    report.num_parameters = sum(_logical_numel(p) for p in model.parameters())
    report.parameter_bytes = sum(p.nbytes for p in model.parameters()) + sum(b.nbytes for b in model.buffers())
    return model, arch, config, scheme


def with_expert_parallel(config, wanted: bool | None):
    """``config`` with the caller's expert-parallel choice (None: unchanged); OptionError when the
    model has no experts to place."""
    if wanted is None:
        return config
    if not getattr(config, "num_experts", 0) or not hasattr(config, "expert_parallel"):
        raise OptionError(f"expert_parallel: the {config.architecture} model has no experts")
    return dataclasses.replace(config, expert_parallel=bool(wanted))


def _name_map(registry: Registry, checkpoint: Checkpoint, arch):
    try:
        return registry.name_map(checkpoint.format, arch.name)
    except UnknownNameError as exc:
        raise exc.at_file(config_file(checkpoint)) from None


def _build(arch, config: ModelConfig, scheme: QuantScheme, parallel: ParallelContext, device, file: str) -> nn.Module:
    try:
        with torch.device(device):
            return arch.build(config, scheme, parallel)
    except CheckpointError as exc:  # a layer refusing a config value (an activation it lacks...)
        raise exc.located(file=file) from exc


def _logical_numel(param) -> int:
    return int(getattr(param, "logical_numel", param.numel()))


def open_checkpoint(reference, *, registry: Registry, load_config: LoadConfig, report: LoadReport) -> Checkpoint:
    with report.phase("resolve"):
        source = sources.resolve(reference)
        loader = pick_loader(registry, source, load_config.format)
    with report.phase("open"):
        checkpoint = loader.open(source, load_config)
    report.format, report.files = checkpoint.format, [str(f) for f in checkpoint.files]
    return checkpoint


def load_local(reference, load_config: LoadConfig, *, parallel: ParallelContext = SINGLE,
               progress: Progress | None = None, registry: Registry | None = None):
    """Load on this process (one rank). Returns (model, arch, config, scheme, tokenizer, report).

    The cyclic garbage collector is off while it runs (``gc_pause.py`` says why)."""
    with collector_paused():
        return _load_local(reference, load_config, parallel=parallel, progress=progress, registry=registry)


def _load_local(reference, load_config: LoadConfig, *, parallel: ParallelContext, progress: Progress | None,
                registry: Registry | None):
    report = LoadReport()
    if registry is None:
        with report.phase("plugins"):  # discovering and importing the plugins: once per process
            registry = default_registry()
    load_config = dataclasses.replace(load_config, tp_rank=parallel.tp_rank, tp_size=parallel.tp_size)
    checkpoint = open_checkpoint(reference, registry=registry, load_config=load_config, report=report)
    try:
        model, arch, config, scheme = load_checkpoint(checkpoint, registry=registry, load_config=load_config,
                                                      report=report, parallel=parallel, progress=progress)
        with report.phase("tokenizer"):
            tokenizer = _tokenizer(checkpoint, load_config)
    finally:
        handed_over = [checkpoint]
        del checkpoint  # the release thread holds the last reference (release.py says why)
        release(handed_over)
    return model, arch, config, scheme, tokenizer, report


def _tokenizer(checkpoint: Checkpoint, load_config: LoadConfig):
    if load_config.tokenizer:
        from transformers import AutoTokenizer  # noqa: PLC0415 - only when overridden

        return AutoTokenizer.from_pretrained(load_config.tokenizer)
    return checkpoint.tokenizer()
