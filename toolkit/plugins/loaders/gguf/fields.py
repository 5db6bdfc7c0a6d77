"""Array metadata fields that decode in bulk (``FastGGUFReader``'s answer for big arrays).

gguf-py's ``ReaderField`` holds an array of N strings as 2N small numpy views (length, bytes)
and decodes them one by one: for Gemma 3's 262,144 tokens that is ~0.7 s to open the file and
~0.8 s more to read the tokens. ``StringArrayField`` keeps only where each string starts and
decodes the whole array with one ``bytes.decode``; ``NumericArrayField`` answers ``contents()``
with one ``tolist()``. Both still offer gguf-py's ``parts``/``data`` (built on first use, the
same views gguf-py would make), so code written against ``ReaderField`` keeps working.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFValueType
from gguf.gguf_reader import ReaderField

CONTINUATION_MASK, CONTINUATION = 0xC0, 0x80  # UTF-8 continuation bytes are 10xxxxxx


class _BulkField(ReaderField):
    """A ``ReaderField`` whose parts are made only when asked for. ``span`` is the byte range the
    field's value occupies in the file (for hashing it without decoding)."""

    def __new__(cls, offset: int, name: str, head: list[np.ndarray], types: list, raw: np.ndarray,
                span: tuple[int, int]):
        field = super().__new__(cls, offset, name, [], [], types)
        field._head, field._raw, field.span, field._made = head, raw, span, None  # noqa: SLF001
        return field

    def value_bytes(self) -> memoryview:
        """The bytes of the value in the file (array header and items), undecoded."""
        return memoryview(self._raw[self.span[0]:self.span[1]]).cast("B")

    @property
    def parts(self) -> list[np.ndarray]:  # type: ignore[override]
        return self._materialize()[0]

    @property
    def data(self) -> list[int]:  # type: ignore[override]
        return self._materialize()[1]

    def _materialize(self) -> tuple[list[np.ndarray], list[int]]:
        if self._made is None:
            parts, idxs = self._value_parts()
            self._made = ([*self._head, *parts], [len(self._head) + i for i in idxs])
        return self._made

    def _value_parts(self) -> tuple[list[np.ndarray], list[int]]:
        raise NotImplementedError


class StringArrayField(_BulkField):
    """An array of strings: ``raw`` is the file's bytes, ``starts`` where each string's bytes begin,
    ``end`` where the last one ends (each string's 8-byte length precedes its start)."""

    def __new__(cls, offset: int, name: str, head: list[np.ndarray], raw: np.ndarray, starts: np.ndarray, end: int):
        first = int(starts[0]) - 8 if len(starts) else end
        field = super().__new__(cls, offset, name, head, [GGUFValueType.ARRAY, GGUFValueType.STRING], raw,
                                (first, end))
        field._starts = starts  # noqa: SLF001
        stops = np.empty_like(starts)
        stops[:-1] = starts[1:] - 8
        if len(starts):
            stops[-1] = end
        field._stops = stops  # noqa: SLF001
        return field

    @property
    def item_count(self) -> int:
        return len(self._starts)

    def _value_parts(self) -> tuple[list[np.ndarray], list[int]]:
        parts: list[np.ndarray] = []
        for start, stop in zip(self._starts.tolist(), self._stops.tolist()):
            parts.append(self._raw[start - 8:start].view(np.uint64))
            parts.append(self._raw[start:stop])
        return parts, list(range(1, len(parts), 2))

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        if isinstance(index_or_slice, int):
            start, stop = int(self._starts[index_or_slice]), int(self._stops[index_or_slice])
            return self._raw[start:stop].tobytes().decode("utf-8")
        return self._decode_all()[index_or_slice]

    def validate(self) -> None:
        """UnicodeDecodeError (as decoding would raise) unless every string is valid UTF-8, without
        making the strings (a 262k-token vocabulary checked in a few ms instead of ~0.1 s)."""
        if len(self._starts):
            self._decoded()

    def runs_of(self, unit: bytes, min_count: int = 2) -> list[int]:
        """Indices of the strings made of ``min_count`` or more copies of ``unit`` and nothing else
        (SentencePiece's runs of "▁"), found in the bytes without decoding every string."""
        starts, lengths, size = self._starts, self._stops - self._starts, len(unit)
        maybe = np.flatnonzero((lengths >= size * min_count) & (lengths % size == 0))
        for k, byte in enumerate(unit * min_count):  # the first min_count units, all candidates at once
            maybe = maybe[self._raw[starts[maybe] + k] == byte]
        return [i for i in maybe.tolist()
                if self._raw[int(starts[i]):int(self._stops[i])].tobytes() == unit * (int(lengths[i]) // size)]

    def _decode_all(self) -> list[str]:
        """Every string, with one UTF-8 decode of their concatenation. UnicodeDecodeError (as
        gguf-py would raise) if any string on its own is not valid UTF-8."""
        if not len(self._starts):
            return []
        text, lead, offsets = self._decoded()
        chars = np.zeros(len(lead) + 1, dtype=np.int64)  # characters before each byte position
        np.cumsum(lead, out=chars[1:])
        cuts = chars[offsets].tolist()
        return [text[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def _decoded(self) -> tuple[str, np.ndarray, np.ndarray]:
        """The concatenation decoded, which of its bytes start a character, and where each string
        begins in it (plus the end)."""
        starts, stops = self._starts, self._stops
        lengths = stops - starts
        # where each string begins in the concatenation
        offsets = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        # the file between the first and the last string, less the 8-byte lengths in between
        region = self._raw[int(starts[0]):int(stops[-1])]
        keep = np.ones(len(region), dtype=bool)
        if len(starts) > 1:
            keep[(starts[1:, None] - 8 - int(starts[0]) + np.arange(8)).ravel()] = False
        blob = region[keep]
        assert len(blob) == total
        text = blob.tobytes().decode("utf-8")
        # the concatenation may be valid where a string alone is not (a character cut in two):
        # every non-empty string must start on a character
        lead = (blob & CONTINUATION_MASK) != CONTINUATION
        heads = offsets[:-1][lengths > 0]
        if not lead[heads].all():
            index = int(np.flatnonzero(lengths > 0)[np.flatnonzero(~lead[heads])[0]])
            raise UnicodeDecodeError("utf-8", bytes(self._raw[int(starts[index]):int(stops[index])]), 0, 1,
                                     f"string {index} starts inside a character")
        return text, lead, offsets


class NumericArrayField(_BulkField):
    """An array of numbers held as one numpy view (``values``)."""

    def __new__(cls, offset: int, name: str, head: list[np.ndarray], values: np.ndarray, item_type,
                raw: np.ndarray, span: tuple[int, int]):
        field = super().__new__(cls, offset, name, head, [GGUFValueType.ARRAY, item_type], raw, span)
        field.values = values
        return field

    @property
    def item_count(self) -> int:
        return len(self.values)

    def _value_parts(self) -> tuple[list[np.ndarray], list[int]]:
        return [self.values], [0]  # one part holding every value, as FastGGUFReader always made

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        if isinstance(index_or_slice, int):
            return self.values[index_or_slice].item()
        return self.values[index_or_slice].tolist()
