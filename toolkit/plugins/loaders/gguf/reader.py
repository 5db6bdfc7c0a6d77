"""gguf-py's ``GGUFReader`` with bulk array parsing, bounds checks and typed errors.

``GGUFReader`` parses array metadata one element at a time (several memmap views per element),
which takes ~13 s for Gemma 3's 262k-token vocabulary. ``FastGGUFReader`` overrides only that
step, producing the same ``ReaderField`` structure (``contents()`` answers as before); the
header, tensor infos and memory-mapped tensor data remain gguf-py's.

It also checks what gguf-py trusts: counts that cannot fit in the file, and the tensor table as
llama.cpp's ``gguf_init_from_file`` does: known types, 1 to 4 dimensions each > 0, rows of whole
blocks, and each tensor's data at exactly the offset the previous ones imply (in table order,
each padded to ``general.alignment``), inside the file; so misaligned, overlapping, swapped or
all-zero offsets are refused instead of loading garbage. Every failure is a CorruptFileError or
UnsupportedQuantTypeError naming the file (and tensor), never an IndexError or a long loop.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField
from gguf.constants import GGUF_MAGIC

from toolkit.core.errors import CheckpointError, CorruptFileError, UnsupportedQuantTypeError

from . import string_index
from .fields import NumericArrayField, StringArrayField

MAGIC = struct.pack("<I", GGUF_MAGIC)  # b"GGUF"
HEADER_BYTES = 24  # magic, version (u32), tensor count (u64), metadata count (u64)
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
KNOWN_TYPES = {int(t) for t in GGMLQuantizationType}
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 50  # ggml counts elements in int64; far beyond any file


def has_magic(path: Path) -> bool:
    """Whether ``path`` is a readable file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


def open_reader(path: Path) -> "FastGGUFReader":
    """A FastGGUFReader over ``path``; CorruptFileError (naming the file) for anything unreadable."""
    _check_header(path)
    try:
        reader = FastGGUFReader(path)
    except CheckpointError:
        raise
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, struct.error, OSError, TypeError,
            ZeroDivisionError, MemoryError) as exc:
        raise CorruptFileError(f"not a readable GGUF file: {type(exc).__name__}: {exc}", file=str(path)) from exc
    if reader.byte_order != "I":  # tensor bytes would need swapping; such files are vanishingly rare
        raise CorruptFileError("the file's byte order differs from this machine's; not supported", file=str(path))
    return reader


def _check_header(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(HEADER_BYTES)
    if head[:4] != MAGIC:
        raise CorruptFileError(f"wrong magic {head[:4]!r}, expected {MAGIC!r}: not a GGUF file", file=str(path))
    if len(head) < HEADER_BYTES:
        raise CorruptFileError(f"truncated header: {size} bytes, a GGUF header needs {HEADER_BYTES}", file=str(path))
    _, tensor_count, kv_count = struct.unpack_from("<IQQ", head, 4)
    # Counts that cannot fit in the file would otherwise drive gguf-py's loops for a very long time.
    if kv_count * MIN_KV_BYTES > size or tensor_count * MIN_TENSOR_INFO_BYTES > size:
        raise CorruptFileError(f"header claims {kv_count} metadata entries and {tensor_count} tensors, "
                               f"more than a {size}-byte file can hold (truncated or corrupt)", file=str(path))


class FastGGUFReader(GGUFReader):
    """GGUFReader whose array fields are parsed in bulk. Little-endian files only take the fast path."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._raw = None
        super().__init__(str(path), mode="r")

    def _bytes(self) -> np.ndarray:
        if self._raw is None:  # a plain ndarray view: slicing it skips memmap's per-view bookkeeping
            self._raw = self.data.view(np.ndarray)
        return self._raw

    def _get(self, offset: int, dtype, count: int = 1, override_order=None) -> np.ndarray:
        """gguf-py's ``_get`` over the plain view: its tensor table and scalar fields take ~7,000 slices
        of the file, and a memmap slice runs two Python methods of numpy's ``memmap`` class each (~40% of
        opening a 1.5B file). The views are the same bytes of the same map."""
        count = int(count)
        dtype = np.dtype(dtype)
        arr = self._bytes()[offset:offset + dtype.itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _build_fields(self, offs: int, count: int) -> int:
        """gguf-py's loop over the key/value pairs, with top-level arrays of strings and numbers
        made as bulk fields (``fields.py``); everything else goes through ``_get_field_parts``."""
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            if len(raw_kv_type) != 1:
                raise self._corrupt(f"metadata entry at byte {orig_offs} is past the end of the file")
            offs += int(raw_kv_type.nbytes)
            name = str(bytes(kv_kdata), encoding="utf-8")
            head = [kv_klen, kv_kdata, raw_kv_type]
            field = self._bulk_array(orig_offs, name, head, offs) if raw_kv_type[0] == GGUFValueType.ARRAY \
                and self.byte_order == "I" else None
            if field is None:
                size, parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
                field = ReaderField(orig_offs, name, head + parts, [i + len(head) for i in idxs], types)
            else:
                size = field.span[1] - offs
            self._push_field(field, skip_sum=True)
            offs += size
        return offs

    def _bulk_array(self, orig_offs: int, name: str, head: list, offs: int):
        """A bulk field for an array of strings or numbers at ``offs``; None for nested arrays."""
        raw_itype, count_part = self._array_header(offs)
        item_type, count = int(raw_itype[0]), int(count_part[0])
        head = [*head, raw_itype, count_part]
        start = offs + 12
        if item_type == GGUFValueType.STRING:
            starts, end = self._string_starts(start, count)
            return StringArrayField(orig_offs, name, head, self._bytes(), starts, end)
        if item_type in self._scalar_types():
            nptype = self.gguf_scalar_to_np[GGUFValueType(item_type)]
            size, (values,), _ = self._scalar_array(start, count, nptype)
            return NumericArrayField(orig_offs, name, head, values, GGUFValueType(item_type), self._bytes(),
                                     (offs, start + size))
        if item_type == GGUFValueType.ARRAY:
            return None
        raise self._corrupt(f"metadata array at byte {offs} has unknown item type {item_type}")

    def _scalar_types(self) -> set[int]:
        return {int(t) for t in self.gguf_scalar_to_np}

    def _array_header(self, offs: int):
        raw_itype = self._get(offs, np.uint32)
        count_part = self._get(offs + 4, np.uint64)
        if len(raw_itype) != 1 or len(count_part) != 1:
            raise self._corrupt(f"metadata array header at byte {offs} is past the end of the file")
        return raw_itype, count_part

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, count_part = self._array_header(orig_offs)
        item_type, count = int(raw_itype[0]), int(count_part[0])
        start = orig_offs + 12
        if item_type == GGUFValueType.STRING:
            size, parts, idxs = self._string_array(start, count)
        elif item_type in self._scalar_types():
            size, parts, idxs = self._scalar_array(start, count, self.gguf_scalar_to_np[GGUFValueType(item_type)])
        elif item_type == GGUFValueType.ARRAY:
            return self._nested_array(orig_offs, raw_itype, count_part, count)
        else:
            raise self._corrupt(f"metadata array at byte {orig_offs} has unknown item type {item_type}")
        return 12 + size, [raw_itype, count_part, *parts], [i + 2 for i in idxs], \
            [GGUFValueType.ARRAY, GGUFValueType(item_type)]

    def _scalar_array(self, start: int, count: int, nptype) -> tuple[int, list, list[int]]:
        nbytes = count * np.dtype(nptype).itemsize
        if start + nbytes > len(self.data):
            raise self._corrupt(f"metadata array of {count} values at byte {start} runs past the end of the file")
        # one part holding every value: ReaderField.contents() flattens parts, so it reads the same
        return nbytes, [self._get(start, nptype, count)], [0]

    def _string_starts(self, start: int, count: int) -> tuple[np.ndarray, int]:
        """Where each of ``count`` strings' bytes begin, and where the last ends (one pass over the
        lengths: each string's position depends on every length before it). A large array's starts
        are kept between loads and reused once the file's bytes prove them (``string_index.py``)."""
        end = len(self.data)
        if start + 8 * count > end:
            raise self._corrupt(f"metadata array of {count} strings at byte {start} runs past the end of the file")
        if count < string_index.MIN_STRINGS:
            return self._scan_string_starts(start, count)
        kept = string_index.load(self.path, self._bytes(), start, count)
        if kept is not None:
            return kept
        starts, stop = self._scan_string_starts(start, count)
        string_index.store(self.path, start, count, starts)
        return starts, stop

    def _scan_string_starts(self, start: int, count: int) -> tuple[np.ndarray, int]:
        end = len(self.data)
        buffer = memoryview(self._bytes())
        length_at = struct.Struct("<Q").unpack_from
        starts = np.empty(count, dtype=np.int64)
        offs = start
        for index in range(count):
            if offs + 8 > end:
                raise self._corrupt(f"string at byte {offs} runs past the end of the file")
            offs += 8
            starts[index] = offs
            offs += length_at(buffer, offs - 8)[0]
        if offs > end:
            raise self._corrupt(f"string at byte {starts[-1] - 8} runs past the end of the file")
        return starts, offs

    def _string_array(self, start: int, count: int) -> tuple[int, list, list[int]]:
        starts, end = self._string_starts(start, count)
        raw = self._bytes()
        stops = [*(starts[1:] - 8).tolist(), end]
        parts: list[np.ndarray] = []
        for begin, stop in zip(starts.tolist(), stops):
            parts.append(raw[begin - 8:begin].view(np.uint64))
            parts.append(raw[begin:stop])
        return end - start, parts, list(range(1, 2 * count, 2))

    def _nested_array(self, orig_offs: int, raw_itype, count_part, count: int):
        if orig_offs + 12 + count * 12 > len(self.data):
            raise self._corrupt(f"nested metadata array of {count} arrays at byte {orig_offs} cannot fit the file")
        offs, parts, idxs = orig_offs + 12, [raw_itype, count_part], []
        types = [GGUFValueType.ARRAY]
        for index in range(count):
            size, sub_parts, sub_idxs, sub_types = self._get_field_parts(offs, GGUFValueType.ARRAY)
            if index == 0:
                types += sub_types
            idxs += [len(parts) + i for i in sub_idxs]
            parts += sub_parts
            offs += size
        return offs - orig_offs, parts, idxs, types

    def _build_tensors(self, start_offs: int, fields) -> None:
        expected = 0  # llama.cpp: each tensor starts where the previous one's padded data ends
        for field in fields:
            expected = self._check_tensor(start_offs, field, expected)
        super()._build_tensors(start_offs, fields)

    def _check_tensor(self, start_offs: int, field, expected: int) -> int:
        """Checks one tensor-table row before gguf-py slices it; returns where the next tensor must start."""
        _, name_data, _, dims, raw_dtype, offset = field.parts
        name = bytes(name_data).decode("utf-8", errors="replace")
        qtype = int(raw_dtype[0])
        if qtype not in KNOWN_TYPES:
            raise UnsupportedQuantTypeError(f"unknown GGML tensor type {qtype}", file=str(self.path), tensor=name)
        if not 1 <= len(dims) <= MAX_DIMS:  # checked before reading them: the count may be huge
            raise CorruptFileError(f"tensor has {len(dims)} dimensions; GGUF allows 1 to {MAX_DIMS}",
                                   file=str(self.path), tensor=name)
        shape = [int(d) for d in dims]
        if min(shape) <= 0:
            raise CorruptFileError(f"tensor dimensions {shape}: each must be > 0", file=str(self.path), tensor=name)
        elements = math.prod(shape)
        if elements > MAX_ELEMENTS:
            raise CorruptFileError(f"tensor dimensions {shape} hold {elements} elements, more than any file can",
                                   file=str(self.path), tensor=name)
        block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        if shape[0] % block:
            raise CorruptFileError(f"row length {shape[0]} is not a multiple of the {block}-element block of "
                                   f"{GGMLQuantizationType(qtype).name}", file=str(self.path), tensor=name)
        nbytes = elements // block * type_bytes
        stored = int(offset[0])
        begin = start_offs + stored
        if begin + nbytes > len(self.data):
            raise CorruptFileError(f"tensor data [{begin}, {begin + nbytes}) lies past the end of the file "
                                   f"({len(self.data)} bytes; truncated?)", file=str(self.path), tensor=name)
        if stored != expected:
            raise CorruptFileError(f"tensor data offset {stored} is not the expected {expected} (tensors must follow "
                                   f"each other in table order, each padded to {self.alignment} bytes: misaligned, "
                                   "overlapping or reordered data)", file=str(self.path), tensor=name)
        return expected + -(-nbytes // self.alignment) * self.alignment

    def _corrupt(self, message: str) -> CorruptFileError:
        return CorruptFileError(message, file=str(self.path))
