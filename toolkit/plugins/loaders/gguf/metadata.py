"""GGUF metadata as a read-only mapping of Python values, decoded on first use.

Large arrays (a 262k-token vocabulary) are decoded only when asked for; ``length`` answers
their size without decoding them.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from gguf import GGUFValueType

from toolkit.core.errors import CorruptFileError, MissingMetadataError

# Header pseudo-fields gguf-py adds; not metadata.
HEADER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


class Metadata(Mapping[str, Any]):
    def __init__(self, fields: Mapping, *, file: str):
        self._fields = {k: v for k, v in fields.items() if k not in HEADER_FIELDS}
        self._cache: dict[str, Any] = {}
        self.file = file

    def __getitem__(self, key: str) -> Any:
        if key not in self._cache:
            field = self._fields[key]  # KeyError for an absent key, as a Mapping must
            with self._decoding(key):
                self._cache[key] = field.contents()
        return self._cache[key]

    def check_decodable(self, key: str) -> None:
        """CorruptFileError naming the key unless its value decodes; a bulk string array is checked
        without making its strings (the tokenizer, when built from the cache, never needs them)."""
        field = self._fields[key]
        if key in self._cache or not hasattr(field, "validate"):
            self[key]
            return
        with self._decoding(key):
            field.validate()

    @contextmanager
    def _decoding(self, key: str):
        try:
            yield
        except (UnicodeDecodeError, ValueError, IndexError, TypeError, OverflowError) as exc:
            # strings are decoded lazily: a bad byte must still name the file and key
            raise CorruptFileError(f"metadata value cannot be decoded: {type(exc).__name__}: {exc}",
                                   file=self.file, key=key) from exc

    def __contains__(self, key: object) -> bool:  # without decoding the value
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def require(self, key: str) -> Any:
        """The value, or MissingMetadataError naming the key and the file."""
        if key not in self._fields:
            raise MissingMetadataError(f"required GGUF metadata key {key!r} is missing", file=self.file)
        return self[key]

    def field(self, key: str):
        """gguf-py's ``ReaderField`` for ``key`` (its raw parts, undecoded)."""
        return self._fields[key]

    def is_array(self, key: str) -> bool:
        field = self._fields.get(key)
        return field is not None and bool(field.types) and field.types[0] == GGUFValueType.ARRAY

    def length(self, key: str) -> int | None:
        """Element count of an array field (without decoding it); None if absent or not an array."""
        if not self.is_array(key):
            return None
        field = self._fields[key]
        if hasattr(field, "item_count"):  # a bulk field (fields.py) knows it without making its parts
            return field.item_count
        if field.types[-1] in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            return len(field.data)  # one data part per element
        return sum(len(field.parts[i]) for i in field.data)  # parts may hold many values each

    def scalars(self, max_items: int = 16) -> dict[str, Any]:
        """Every field, with long arrays shown as a count (for ``toolkit inspect``)."""
        shown: dict[str, Any] = {}
        for key in self._fields:
            count = self.length(key)
            shown[key] = f"[{count} items]" if count is not None and count > max_items else self[key]
        return shown
