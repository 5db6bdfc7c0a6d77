"""The files around a Hugging Face checkpoint's weights, read as untrusted input.

* ``config.json`` must be UTF-8 JSON holding an object.
* An index (``model.safetensors.index.json``) must hold a ``weight_map`` object of tensor name ->
  shard file name, where each shard is a plain file name inside the model directory (no path
  separators, no ``..``, no absolute paths: such entries are refused, never opened) that exists.
* A ``.bin`` file is unpickled with torch's weights-only unpickler; anything that goes wrong
  there is a typed error, and the result must be a dict of str -> dense, floating-point tensors
  of at least one dimension (a quantized checkpoint's packed integer tensors and scalars pass).

Every failure is a typed error naming the file (and the key or tensor).
"""
from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from toolkit.core.errors import CorruptFileError, SourceError, UnsafeCheckpointError

INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
MAX_JSON_BYTES = 64 << 20  # an index of a 10k-tensor model is ~1 MB; a config a few KB


def has_weights(folder: Path) -> bool:
    """Whether ``folder`` looks like it holds HF weights (for ``detect``; ``open`` checks them)."""
    return any((folder / index).is_file() for index in (INDEX, BIN_INDEX)) or \
        any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; CorruptFileError for unreadable, non-UTF-8, invalid or non-object JSON."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CorruptFileError(f"{path.stat().st_size} bytes is far too large for a JSON config/index",
                                   file=str(path))
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise CorruptFileError(f"cannot read the file: {exc}", file=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise CorruptFileError(f"not UTF-8 text: {exc}", file=str(path)) from exc
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptFileError(f"not valid JSON: {exc}", file=str(path)) from exc
    if not isinstance(value, dict):
        raise CorruptFileError(f"expected a JSON object, found {type(value).__name__}", file=str(path))
    return value


def contained_file(folder: Path, name: Any, *, index: Path, tensor: str | None = None) -> Path:
    """``folder / name`` for a plain file name that stays inside ``folder`` and exists."""
    if not isinstance(name, str) or not name:
        raise CorruptFileError(f"shard entry {name!r} is not a file name", file=str(index), tensor=tensor)
    if "/" in name or "\\" in name or name in (".", "..") or Path(name).is_absolute() or "\x00" in name:
        raise CorruptFileError(f"shard entry {name!r} is not a plain file name inside the model directory; "
                               "refused", file=str(index), tensor=tensor)
    path = folder / name
    if path.resolve().parent != folder.resolve():
        raise CorruptFileError(f"shard entry {name!r} leaves the model directory; refused", file=str(index),
                               tensor=tensor)
    if not path.is_file():
        raise SourceError(f"{index} names shard {name!r}, which does not exist in {folder}")
    return path


def read_index(path: Path) -> dict[str, Path]:
    """tensor name -> shard path, from an index file (see the module docstring)."""
    index = read_json_object(path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise CorruptFileError(f"'weight_map' must be an object of tensor name -> shard file, found "
                               f"{type(weight_map).__name__}", file=str(path))
    if not weight_map:
        raise CorruptFileError("'weight_map' is empty", file=str(path))
    shards: dict[str, Path] = {}
    result: dict[str, Path] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CorruptFileError(f"shard entry {shard!r} is not a file name", file=str(path), tensor=name)
        if shard not in shards:
            shards[shard] = contained_file(path.parent, shard, index=path, tensor=name)
        result[name] = shards[shard]
    return result


def load_bin(path: Path, *, packed: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a torch ``.bin`` file (see the module docstring)."""
    try:
        # mmap needs the zip container torch.save writes since 1.6; older pickles load eagerly
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(f"refused: the pickle holds objects other than tensors, or is corrupt ({exc})",
                                    file=str(path)) from exc
    except MemoryError as exc:
        raise CorruptFileError("the pickle asks for more memory than is available (corrupt sizes?)",
                               file=str(path)) from exc
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted bytes: whatever it raises, the file is bad
        raise CorruptFileError(f"not a readable torch checkpoint: {type(exc).__name__}: {exc}",
                               file=str(path)) from exc
    if not isinstance(state, dict):
        raise UnsafeCheckpointError(f"expected a dict of tensors, found {type(state).__name__}", file=str(path))
    for name, tensor in state.items():
        check_bin_tensor(name, tensor, path, packed=packed)
    return state


def check_bin_tensor(name: Any, tensor: Any, path: Path, *, packed: bool) -> None:
    if not isinstance(name, str):
        raise CorruptFileError(f"tensor key {name!r} is a {type(name).__name__}, not a string", file=str(path))
    if not isinstance(tensor, torch.Tensor):
        raise CorruptFileError(f"value is a {type(tensor).__name__}, not a tensor", file=str(path), tensor=name)
    problem = None
    if tensor.layout != torch.strided:
        problem = f"a {tensor.layout} (sparse) tensor"
    elif tensor.is_quantized:
        problem = "a torch-quantized tensor"
    elif tensor.device.type != "cpu":
        problem = f"a tensor on the {tensor.device.type} device (no data)"
    elif packed:  # quantized checkpoints: packed integer codes and small scalar statistics are expected
        return
    elif tensor.dim() == 0:
        problem = "a scalar (0-dimensional) tensor"
    elif not tensor.is_floating_point():
        problem = f"a {tensor.dtype} tensor; weights are floating point"
    if problem:
        raise CorruptFileError(f"{problem} is not a model weight", file=str(path), tensor=name)
