"""A tensorizer stored state read back as a Checkpoint: the loading rank's file, streamed.

Same contract as the sharded checkpoint (identity names, ``load_stored``, tp checked when
tensors are first asked for); integrity comes from tensorizer's own per-tensor hashes
(``verify_hash``) and, when encrypted, from its authenticated encryption.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch

from toolkit.core.errors import CheckpointError, CorruptFileError
from toolkit.plugins.loaders.sharded.errors import ChecksumMismatchError
from toolkit.plugins.loaders.sharded.manifest_checkpoint import ManifestCheckpoint
from toolkit.plugins.loaders.sharded.stored import dtype_name

from .crypt import Key, decryption_params
from .writer import MANIFEST, TAG


class DecryptionError(CheckpointError):
    """An encrypted state opened without its key, or with the wrong one."""


class TensorizerCheckpoint(ManifestCheckpoint):
    format = "tensorizer"

    def __init__(self, folder: Path, *, tp_rank: int, tp_size: int, device: torch.device,
                 key: Key | None = None, verify_hash: bool = False):
        super().__init__(folder, manifest_name=MANIFEST, tag=TAG, tp_rank=tp_rank, tp_size=tp_size)
        self.device, self.key, self.verify_hash = device, key, verify_hash

    def read_tensors(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        entry = self._entry()
        if self.manifest.get("encrypted") and self.key is None:
            raise DecryptionError("this state is encrypted; set TOOLKIT_TENSORIZER_KEY (passphrase) or "
                                  "TOOLKIT_TENSORIZER_KEY_FILE (raw key)", file=str(self.manifest_path))
        expected = {record["name"]: record for record in entry["tensors"]}
        for file_name in entry["files"]:
            path = self.folder / file_name
            for name, tensor in _deserialize(path, self.device, self.key, self.verify_hash):
                _check_record(expected.pop(name, None), name, tensor, path)
                yield name, str(path), tensor
        if expected:
            raise CorruptFileError(f"{len(expected)} tensors listed in the manifest are missing from the files",
                                   file=str(self.folder), tensor=next(iter(expected)))


def _deserialize(path: Path, device: torch.device, key: Key | None, verify_hash: bool):
    """(name, tensor) pairs streamed from one tensorizer file; library errors become typed ones."""
    from tensorizer import TensorDeserializer  # noqa: PLC0415 - optional dependency
    from tensorizer.serialization import CryptographyError, HashMismatchError  # noqa: PLC0415

    try:
        # one reader thread with a passphrase: tensorizer caches the derived key, but concurrent readers
        # each derive it (Argon2id, ~1 s and 256 MiB apiece) before the cache is filled
        readers = 1 if isinstance(key, str) else None
        deserializer = TensorDeserializer(str(path), device=device, lazy_load=True, verify_hash=verify_hash,
                                          encryption=decryption_params(key), num_readers=readers)
        with deserializer:
            for _module, _kind, name, tensor in deserializer.read_tensors():
                yield name, tensor
    except HashMismatchError as exc:
        raise ChecksumMismatchError(f"tensorizer hash verification failed: {exc}", file=str(path)) from exc
    except CryptographyError as exc:
        raise DecryptionError(f"cannot decrypt (wrong key, or the file was modified): {exc}",
                              file=str(path)) from exc
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted bytes: whatever it raises, the file is bad
        raise CorruptFileError(f"not a readable tensorizer file: {type(exc).__name__}: {exc}", file=str(path)) from exc


def _check_record(record: dict[str, Any] | None, name: str, tensor: torch.Tensor, path: Path) -> None:
    if record is None:
        raise CorruptFileError("tensor is not listed in the manifest for this rank", file=str(path), tensor=name)
    found = (dtype_name(tensor.dtype), list(tensor.shape))
    if found != (record["dtype"], list(record["shape"])):
        raise ChecksumMismatchError(f"tensor is {found[0]} {found[1]}, the manifest recorded "
                                    f"{record['dtype']} {record['shape']}", file=str(path), tensor=name)
