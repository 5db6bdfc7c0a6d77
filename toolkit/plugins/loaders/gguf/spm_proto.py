"""A SentencePiece ``ModelProto`` (serialized) for a GGUF ``llama`` vocabulary, written by hand.

Only the handful of fields ``sentencepiece`` reads at encode time are written (field numbers from
its ``sentencepiece_model.proto``): the pieces (text, score, type), the trainer spec's model type
(BPE) and byte fallback, and a normalizer that only escapes spaces as ``▁``, like llama.cpp's
``llama_escape_whitespace`` (no dummy prefix: ``spm_tokenizer.py`` adds llama.cpp's space prefix
itself, since llama.cpp adds it after every special token too; no extra-whitespace removal; no
character map). Writing the few varints by hand spares a ``protobuf`` dependency.

Piece types: NORMAL for normal and unused tokens (llama.cpp merges into any token of the
vocabulary); BYTE for ``<0xXX>``; UNKNOWN for the file's unknown token (sentencepiece wants
exactly one); CONTROL for control, user-defined and other unknown tokens. ``spm_tokenizer.py`` cuts those out of the text before ``sentencepiece``
sees it, as llama.cpp does, so they never need to form from characters.
"""
from __future__ import annotations

import struct

# llama.cpp token types (gguf-py's TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# sentencepiece's ModelProto.SentencePiece.Type
_SPM_TYPE = {NORMAL: 1, UNUSED: 1, UNKNOWN: 3, CONTROL: 3, USER_DEFINED: 3, BYTE: 6}
_BPE = 2  # TrainerSpec.ModelType.BPE


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _flag(number: int, value: int) -> bytes:
    """A varint field (wire type 0)."""
    return _varint(number << 3) + _varint(value)


def model_proto(pieces: list[str], scores: list[float], types: list[int]) -> bytes:
    """The serialized ``ModelProto``. ``types`` are sentencepiece types (``spm_types``)."""
    out = bytearray()
    pack = struct.Struct("<f").pack
    for piece, score, kind in zip(pieces, scores, types):
        text = piece.encode("utf-8")
        body = b"\x0a" + _varint(len(text)) + text + b"\x15" + pack(score)
        if kind != 1:  # NORMAL is the default
            body += b"\x18" + _varint(kind)
        out += b"\x0a" + _varint(len(body)) + body
    trainer = _flag(3, _BPE) + _flag(4, len(pieces)) + _flag(35, 1)
    normalizer = _field(1, b"identity") + _flag(3, 0) + _flag(4, 0) + _flag(5, 1)
    out += _field(2, trainer) + _field(3, normalizer)
    return bytes(out)


def spm_types(gguf_types: list[int], unknown_id: int) -> list[int] | None:
    """sentencepiece piece types for llama.cpp token types; None when one has no counterpart."""
    out = []
    for kind in gguf_types:
        spm = _SPM_TYPE.get(kind)
        if spm is None:
            return None
        out.append(spm)
    out[unknown_id] = 2
    return out
