"""A GGUF source's ``tokenizer.*`` fields, copied into a GGUF output byte for byte.

Re-quantizing a GGUF file (``toolkit convert a.gguf b.gguf --to gguf:Q4_K_M``) needs no tokenizer
object: writer_tokenizer.py's rules turn a transformers tokenizer into these fields, and a GGUF
source already holds them. Building the ``tokenizers`` tokenizer just to write its fields back
took ~7 s for Gemma 3's 262k-token vocabulary; the copy takes milliseconds.

The writer's rules still hold where a source might not follow them (a file another tool wrote):

* SentencePiece (``llama``) vocabularies carry no merges (llama.cpp never reads them): dropped;
* Gemma's pieces of two or more ``▁`` are stored as spaces, as llama.cpp stores them: rewritten;
* the token list must cover the embedding's rows (the writer pads with ``[PAD{i}]`` otherwise):
  when it does not, ``copyable`` says no and the writer builds the vocabulary as for any source.

Everything else (``pre``, scores, token types, special ids, add-BOS/EOS flags, chat templates)
is the source's own value. Values are copied as their encoded bytes (``RawValue``), so floats,
strings and integer widths are exactly the source's.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from gguf import GGUFValueType, GGUFWriter

from .fields import NumericArrayField, StringArrayField

PREFIX = "tokenizer."
MERGES = "tokenizer.ggml.merges"
TOKENS = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class RawValue:
    """A metadata value as the bytes that follow its type in a GGUF file."""

    data: bytes


class RawGGUFWriter(GGUFWriter):
    """gguf-py's writer, plus values given as ``RawValue`` (written as they are)."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if isinstance(val, RawValue):
            return (struct.pack("<I", int(vtype)) if add_vtype else b"") + val.data
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def has_tokenizer_fields(checkpoint) -> bool:
    """A GGUF checkpoint (ours, checkpoint.py) whose metadata holds a vocabulary."""
    metadata = getattr(checkpoint, "metadata", None)
    return getattr(checkpoint, "format", None) == "gguf" and metadata is not None and TOKENS in metadata


def copyable(metadata, vocab_size: int) -> bool:
    return metadata.length(TOKENS) == vocab_size


def copy_tokenizer_fields(writer: GGUFWriter, metadata, *, gguf_arch: str) -> list[str]:
    """Add the source's ``tokenizer.*`` fields to ``writer`` (see the module docstring); returns notes."""
    from .tokenizer import GEMMA_ARCHS, SPACE  # noqa: PLC0415 - tokenizer.py imports `tokenizers` (direct.py avoids it)

    notes = []
    model = metadata.get("tokenizer.ggml.model", "llama")
    for key in metadata:
        if not key.startswith(PREFIX):
            continue
        if key == MERGES and model == "llama":
            notes.append("tokenizer.ggml.merges: dropped (llama.cpp's SentencePiece tokenizer never reads them)")
            continue
        field = metadata.field(key)
        # (a vocabulary without runs of "▁" is copied as stored: no need to decode its strings)
        if key == TOKENS and model == "llama" and gguf_arch in GEMMA_ARCHS and _may_hold_runs(field, SPACE):
            tokens = list(metadata[key])
            spaced = [" " * len(t) if len(t) > 1 and not t.strip(SPACE) else t for t in tokens]
            if spaced != tokens:
                writer.add_key_value(key, spaced, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
                continue
        writer.add_key_value(key, RawValue(value_bytes(field)), field.types[0])
    return notes


def _may_hold_runs(field, char: str) -> bool:
    """Whether some string of the array field is two or more ``char`` and nothing else (a bulk
    string field answers from its bytes; any other kind of field may)."""
    return not isinstance(field, StringArrayField) or bool(field.runs_of(char.encode()))


def value_bytes(field) -> bytes:
    """The encoded value of a reader field (what follows its value type in the file): for a bulk
    array field (fields.py), the item type and count, then its items (the numbers' own view, or the
    strings' bytes with their lengths); a plain ReaderField's parts are [key length, key, value
    type, value parts...]."""
    if isinstance(field, NumericArrayField):
        return struct.pack("<IQ", int(field.types[-1]), field.item_count) + field.values.tobytes()
    if isinstance(field, StringArrayField):
        return struct.pack("<IQ", int(GGUFValueType.STRING), field.item_count) + bytes(field.value_bytes())
    return b"".join(part.tobytes() for part in field.parts[3:])
