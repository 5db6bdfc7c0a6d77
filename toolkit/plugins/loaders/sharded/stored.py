"""A rank's stored state: every parameter exactly as it sits in memory, as named plain tensors.

Writers of per-rank state (sharded safetensors, tensorizer) share this module. A parameter
answers ``stored_state() -> {part: tensor}`` (``core/params.py``); the saved tensor name is
the parameter name, plus ``:part`` for parts other than ``""``. Reading back, the name map
below routes each tensor to ``param.load_stored(tensor, part=part)`` unchanged.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from toolkit.core.errors import ConversionError, CorruptFileError
from toolkit.core.names import MappedName, NameContext
from toolkit.core.params import ModelParameter

PART_SEPARATOR = ":"  # never part of a module or parameter name


@dataclass(frozen=True)
class StoredTensor:
    """One saved tensor: ``name`` (``param`` or ``param:part``) and its value, on CPU."""

    name: str
    tensor: torch.Tensor


def stored_name(param_name: str, part: str) -> str:
    return param_name if part == "" else f"{param_name}{PART_SEPARATOR}{part}"


def split_stored_name(name: str) -> tuple[str, str]:
    """``"a.b.weight:absmax"`` -> (``"a.b.weight"``, ``"absmax"``); no separator -> part ``""``."""
    param_name, _, part = name.partition(PART_SEPARATOR)
    return param_name, part


def check_saveable(model: nn.Module) -> None:
    """Refuse, before writing anything, a model whose state the protocol cannot carry."""
    for name, param in model.named_parameters():
        if not declares_stored_state(param):
            raise ConversionError(f"parameter {name!r} is a {type(param).__name__}, which does not implement "
                                  "stored_state()/load_stored(); its scheme cannot save in-memory state yet")
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    extra = [key for key in model.state_dict(keep_vars=True) if key not in params]
    if extra:
        raise ConversionError(f"persistent buffers {extra[:3]} are not parameters; the stored-state protocol "
                              "carries parameters only (keep scheme state inside stored_state())")


def declares_stored_state(param) -> bool:
    """A plain ModelParameter, or a class that defines its own stored state. A subclass inheriting
    the plain version is refused: its memory may hold more than ``data`` (a quant state), and
    saving only ``data`` would lose it silently."""
    cls = type(param)
    if cls is ModelParameter:
        return True
    return (callable(getattr(param, "stored_state", None)) and callable(getattr(param, "load_stored", None))
            and getattr(cls, "stored_state", None) is not ModelParameter.stored_state
            and getattr(cls, "load_stored", None) is not ModelParameter.load_stored)


def iter_stored(model: nn.Module) -> Iterator[StoredTensor]:
    """Every parameter's parts, one at a time, as contiguous CPU tensors owning their bytes."""
    for param_name, param in model.named_parameters():
        for part, tensor in param.stored_state().items():
            if PART_SEPARATOR in part:
                raise ConversionError(f"stored part {part!r} of {param_name!r} contains {PART_SEPARATOR!r}")
            yield StoredTensor(stored_name(param_name, part), _detached_copy(tensor))


def _detached_copy(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ConversionError(f"stored_state() must return tensors, got {type(tensor).__name__}")
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.contiguous().clone()  # never share storage with the live model or another part
    return tensor.to("cpu").contiguous()


def sha256(tensor: torch.Tensor) -> str:
    """Hex digest of a CPU tensor's bytes (its element bytes in row-major order)."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy()).hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def model_fields(loaded) -> dict[str, Any]:
    """The manifest fields that describe the model and its scheme (shared by every stored-state writer).

    The scheme's own ``stored_metadata()`` (when it has one) is what its factory's
    ``from_checkpoint`` needs to create parameters in the layout ``stored_state`` holds.
    """
    scheme = loaded.scheme
    stored_metadata = getattr(scheme, "stored_metadata", None)
    fields = {
        "architecture": loaded.arch.name,
        "hf_config": loaded.config.raw,
        "quant_scheme": scheme.name,
        "quant_metadata": stored_metadata() if stored_metadata is not None else None,
        "params_dtype": dtype_name(scheme.params_dtype),
        "tp_size": loaded.parallel.tp_size,
    }
    json_text(fields)  # fail now, before any file is written, if something cannot be saved
    return fields


def json_text(value: Any) -> str:
    """Pretty JSON; numpy scalars and arrays become numbers and lists, anything else is a ConversionError."""
    try:
        return json.dumps(value, indent=1, default=_jsonable)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"manifest value is not JSON-serialisable: {exc}") from exc


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


@dataclass(frozen=True)
class StoredNameMap:
    """Identity map for stored-state checkpoints: ``param[:part]`` -> that parameter's ``load_stored``."""

    format: str
    architecture: str = "*"

    def map(self, name: str, context: NameContext) -> MappedName | None:
        param_name, part = split_stored_name(name)
        return MappedName(param_name, stored_part=part)


def save_tokenizer(tokenizer, folder) -> list[str]:
    """Write the model's tokenizer files into ``folder`` (transformers' own format); their names."""
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        return []
    before = {path.name for path in folder.iterdir()}
    tokenizer.save_pretrained(str(folder))
    return sorted(path.name for path in folder.iterdir() if path.name not in before)


def load_tokenizer(folder, names: list[str]):
    """The tokenizer saved by :func:`save_tokenizer`, or None when none was saved."""
    if not names:
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow import, only when needed

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - transformers/tokenizers on untrusted files (tokenizers can panic)
        raise CorruptFileError(f"cannot load the saved tokenizer ({', '.join(names)}): {type(exc).__name__}: {exc}",
                               file=str(folder)) from exc
