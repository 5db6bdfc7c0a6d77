"""An on-disk cache of tokenizers built from GGUF metadata.

Deriving SentencePiece merges and building the Rust tokenizer of a 262k-token vocabulary takes
seconds; reading the built tokenizer back from its JSON takes a fraction of that. The cache key
is a hash of the raw bytes of every ``tokenizer.ggml.*`` field (plus the architecture, which
changes how Gemma's vocabulary is read, and the versions of this builder and of ``tokenizers``),
taken straight from the file's memory map without decoding a string.

Location: ``$TOOLKIT_TOKENIZER_CACHE`` if set (empty or ``off`` disables the cache), else
``$XDG_CACHE_HOME/toolkit/tokenizers`` (``~/.cache/toolkit/tokenizers``). Entries are written to
a temporary file and renamed into place, so concurrent processes never read a partial entry;
an unreadable entry is rebuilt and rewritten, with a warning. An entry from an older builder
has another key, so it is never read (nor removed: another checkout may still use it).

An entry is written only for metadata that passed ``check_tokenizer_metadata``, so an entry
under a key says that those exact bytes passed the checks: ``checked_before`` lets the checks
at open time be skipped on a hit (they decode and compare every token and merge: ~0.05-0.1 s
for Gemma 3's 262k tokens, more for vocabularies with merges).

SentencePiece vocabularies built for ``sentencepiece`` (``spm_tokenizer.py``) are kept under the
same key as ``KEY.spm``: a magic line, a hash of the rest (a damaged entry is rebuilt, never read
into wrong ids), then ``SpmBackend.to_bytes()`` (a small JSON header and the ModelProto).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import tokenizers
from tokenizers import Tokenizer

from .cache_paths import ENV, cache_dir  # noqa: F401 - ENV is part of this module's interface
from .metadata import Metadata

if TYPE_CHECKING:
    from .spm_tokenizer import SpmBackend

# bump when the builder would produce a different tokenizer from the same metadata, or when the
# checks (tokenizer_checks.py) would refuse metadata they accepted before
BUILDER_VERSION = "6"


def cache_key(metadata: Metadata) -> str:
    """A hash of what the tokenizer is built from (raw field bytes, not decoded values); computed
    once per ``Metadata`` (the checks at open time and the build both ask for it)."""
    key = vars(metadata).get("_tokenizer_cache_key")
    if key is None:
        key = _hash(metadata)
        vars(metadata)["_tokenizer_cache_key"] = key
    return key


def _hash(metadata: Metadata) -> str:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{BUILDER_VERSION}|{tokenizers.__version__}|".encode())
    digest.update(str(metadata.get("general.architecture")).encode())
    for key in sorted(k for k in metadata if k.startswith("tokenizer.ggml.")):
        digest.update(b"\0" + key.encode() + b"\0")
        digest.update(_raw_bytes(metadata, key))
    return digest.hexdigest()


def _raw_bytes(metadata: Metadata, key: str) -> memoryview | bytes:
    """The bytes a field occupies in the file: its parts are consecutive views of one memory map,
    so the span from the first part to the end of the last covers them all."""
    field = metadata.field(key)
    if hasattr(field, "value_bytes"):  # a bulk field (fields.py): its bytes, without making its parts
        return field.value_bytes()
    parts = [p for p in field.parts if p.nbytes]
    if not parts:
        return b""
    start = parts[0].__array_interface__["data"][0]
    end = parts[-1].__array_interface__["data"][0] + parts[-1].nbytes
    if end < start or not all(p.flags.c_contiguous for p in (parts[0], parts[-1])):
        return b"".join(p.tobytes() for p in parts)  # not one span: hash the parts themselves
    return memoryview((ctypes.c_char * (end - start)).from_address(start)).cast("B")


def entry_path(metadata: Metadata) -> Path | None:
    """Where the entry for this metadata is (or would be) kept; None when caching is off."""
    folder = cache_dir()
    return None if folder is None else folder / f"{cache_key(metadata)}.json"


def spm_entry_path(metadata: Metadata) -> Path | None:
    """Where the ``sentencepiece`` entry for this metadata is (or would be) kept; None when caching is off."""
    path = entry_path(metadata)
    return None if path is None else path.with_suffix(".spm")


def checked_before(metadata: Metadata) -> bool:
    """Whether the cache holds an entry for exactly this tokenizer metadata, which was therefore
    checked when the entry was written (``cached_backend`` and ``cached_spm`` check before they store)."""
    if "tokenizer.ggml.tokens" not in metadata:
        return False
    path = entry_path(metadata)
    return path is not None and (path.is_file() or path.with_suffix(".spm").is_file())


def cached_backend(metadata: Metadata, build: Callable[[Metadata], Tokenizer | None]) -> Tokenizer | None:
    """``build(metadata)``, read from the cache when the same metadata was built before. A miss
    runs ``check_tokenizer_metadata`` before building (the checks at open time may have been
    skipped for an entry that turned out unreadable), so every stored entry was checked."""
    return _through_cache(metadata, entry_path(metadata), lambda path: Tokenizer.from_file(str(path)), build, _store)


def cached_spm(metadata: Metadata, build: Callable[[Metadata], "SpmBackend | None"]) -> "SpmBackend | None":
    """``build(metadata)`` (``spm_tokenizer.build_spm``), read from the cache when the same metadata
    was built before; like ``cached_backend``, a miss checks the metadata before it builds and stores."""
    from .spm_tokenizer import SpmBackend  # noqa: PLC0415 - imports sentencepiece

    def store(path: Path, backend: SpmBackend) -> None:
        payload = backend.to_bytes()
        _store(path, _SPM_MAGIC + _spm_digest(payload) + payload)

    return _through_cache(metadata, spm_entry_path(metadata),
                          lambda path: SpmBackend.from_bytes(_spm_payload(path.read_bytes())), build, store)


def _through_cache(metadata: Metadata, path: Path | None, read, build, store):
    """The entry at ``path`` read back, or (absent or unreadable: warned) ``build(metadata)`` after the metadata
    checks, stored there; ``path`` None: no cache, just ``build``."""
    if path is None:
        return build(metadata)
    if path.is_file():
        try:
            return read(path)
        except Exception as exc:  # noqa: BLE001 - a damaged entry is rebuilt (and replaced) below
            warnings.warn(f"{metadata.file}: ignoring the unreadable cached tokenizer {path} "
                          f"({type(exc).__name__}: {str(exc)[:200]}); rebuilding it", stacklevel=4)
    from .tokenizer_checks import check_tokenizer_metadata  # noqa: PLC0415 - the checks import this module

    check_tokenizer_metadata(metadata, trust_cache=False)
    backend = build(metadata)
    if backend is not None:
        store(path, backend)
    return backend


_SPM_MAGIC = b"toolkit sentencepiece entry 1\n"


def _spm_digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def _spm_payload(entry: bytes) -> bytes:
    """The payload of a ``.spm`` entry, after checking its magic and hash (ValueError if either is off)."""
    if not entry.startswith(_SPM_MAGIC):
        raise ValueError("not a toolkit sentencepiece entry")
    digest, payload = entry[len(_SPM_MAGIC):len(_SPM_MAGIC) + 16], entry[len(_SPM_MAGIC) + 16:]
    if _spm_digest(payload) != digest:
        raise ValueError("its hash does not match its contents")
    return payload


def entry_text(backend: Tokenizer) -> str:
    """The tokenizer's JSON in the form ``tokenizers`` reads back fastest, same tokenizer.

    ``Tokenizer.from_file`` parses the model into serde_json values first: the vocabulary goes into
    an ordered map (inserting 262k keys in id order is far slower than in key order) and each
    ``["left", "right"]`` merge into three allocations instead of one ``"left right"`` string. With
    the vocabulary in key order and merges as strings, Gemma 3's entry reads back in ~30% less CPU
    time (1.67 s -> 1.17 s, on the shared box). Merges keep the pair form when a piece holds a space
    (the string form could not say where it splits).
    """
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") == "BPE" and isinstance(model.get("vocab"), dict):
        # Rust orders strings by their UTF-8 bytes, which is Python's code point order
        model["vocab"] = dict(sorted(model["vocab"].items()))
        merges = model.get("merges") or []
        if merges and all(isinstance(m, list) and " " not in m[0] and " " not in m[1] for m in merges):
            model["merges"] = [f"{left} {right}" for left, right in merges]
    return json.dumps(spec, ensure_ascii=False, separators=(",", ":"))


def _store(path: Path, backend: "Tokenizer | bytes") -> None:
    """Write atomically (a temporary file renamed into place; removed if anything fails): a cache
    that cannot be written only costs the next load its time, so nothing here fails the load."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".partial")
        try:
            data = backend if isinstance(backend, bytes) else entry_text(backend).encode("utf-8")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    except Exception as exc:  # noqa: BLE001 - see above
        warnings.warn(f"could not write the tokenizer cache entry {path} ({type(exc).__name__}: {str(exc)[:200]})",
                      stacklevel=4)
