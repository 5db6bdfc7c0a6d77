"""GGUF SentencePiece vocabularies (``tokenizer.ggml.model = llama``) encoded by Google's ``sentencepiece``.

llama.cpp's SPM tokenizer is SentencePiece's BPE algorithm: the text's characters are merged pair
by pair, the pair whose merged piece scores best first (ties: the leftmost), a character missing
from the vocabulary is spelled by its UTF-8 ``<0xXX>`` byte pieces. ``sentencepiece`` implements
exactly that, in C++, from a ``ModelProto`` (``spm_proto.py`` writes one from the GGUF arrays),
and loads a 262k-piece model in well under 0.1 s, where ``tokenizers`` needs ~0.7 s to read back
the same vocabulary as a BPE with merges (docs/benchmarks.md).

What llama.cpp does around the merging is done here, as it does it:

* control and user-defined tokens (the same set ``tokenizer._add_marked_tokens`` gives
  ``tokenizers``) are cut out of the text first, leftmost and longest first, and become their ids;
* each piece of text between them is encoded on its own; with ``tokenizer.ggml.add_space_prefix``
  (default on) a space is put before a piece that starts the text or follows a special token;
* BOS/EOS are added as the file's flags say (``GGUFTokenizer`` passes them in).

Decoding mirrors the ``tokenizers`` decoder this replaces (``▁`` -> space, consecutive ``<0xXX>``
pieces joined into UTF-8 or one U+FFFD per byte, one leading space dropped when the prefix is on),
so both backends give the same text for the same ids (tests/test_gguf_spm_tokenizer.py).

``build_spm`` returns None (with a debug log line naming why) when the vocabulary has something a
``ModelProto`` cannot hold: a token spelled twice or empty, an unknown token type, no unknown
token, a byte piece missing. The caller then uses ``tokenizers``, as it does when
``sentencepiece`` is not installed.
"""
from __future__ import annotations

import json
import logging
import re
import struct
import warnings
from typing import Iterable

from .metadata import Metadata
from .pretokenizers import CONTROL_TEXTS, PLAIN_END_MARKERS
from .spm_proto import BYTE, CONTROL, UNKNOWN, USER_DEFINED, model_proto, spm_types

log = logging.getLogger(__name__)
SPACE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def available() -> bool:
    try:
        import sentencepiece  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def marked_tokens(tokens: list[str], types: list[int]) -> tuple[list[int], list[int]]:
    """(control ids, user-defined ids): the tokens matched whole in the text, as
    ``tokenizer._add_marked_tokens`` chooses them (control ones are special: skipped by
    ``decode(skip_special_tokens=True)``)."""
    promoted = CONTROL_TEXTS
    if "</s>" in tokens and any(marker in tokens for marker in PLAIN_END_MARKERS):
        promoted = CONTROL_TEXTS - {"</s>"}
    control = [i for i, (t, kind) in enumerate(zip(tokens, types))
               if t and (kind == CONTROL or (t in promoted and kind != USER_DEFINED))]
    user = [i for i, (t, kind) in enumerate(zip(tokens, types)) if kind == USER_DEFINED and t]
    return control, user


class _Encoding:
    """What ``GGUFTokenizer`` reads from an encoding (``tokenizers.Encoding.ids``)."""
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]):
        self.ids = ids


class SpmBackend:
    """The subset of ``tokenizers.Tokenizer`` that ``GGUFTokenizer`` uses, over ``sentencepiece``.

    ``header`` (JSON-able): ``prefix`` (llama.cpp's add_space_prefix), ``control`` and ``user``
    (``[[id, text], ...]``: the tokens cut out of the text). ``proto``: the serialized ModelProto.
    """

    def __init__(self, header: dict, proto: bytes):
        import sentencepiece  # noqa: PLC0415 - optional: build_spm is only called when it imports

        self.header, self.proto = header, proto
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        self._size = self._sp.get_piece_size()
        self._prefix = bool(header["prefix"])
        marked = {text: index for index, text in header["user"]}
        marked.update({text: index for index, text in header["control"]})
        self._marked = marked
        self._special_ids = {index for index, _ in header["control"]}
        self._index_marked()
        self._bos: int | None = None
        self._eos: int | None = None

    # ---- what GGUFTokenizer calls -------------------------------------------------------------
    def set_specials(self, specials: Iterable[str], bos: str | None, eos: str | None) -> None:
        """``_prepare``'s part for this backend: named special tokens are matched in the text and
        skipped as special (``tokenizers`` adds any that are not added tokens yet), and the
        BOS/EOS the encoding starts/ends with (None: none)."""
        for text in specials:
            index = self.token_to_id(text)
            if index is not None and text not in self._marked:
                self._marked[text] = index
                self._index_marked()
            if index is not None:
                self._special_ids.add(index)
        self._bos = None if bos is None else self.token_to_id(bos)
        self._eos = None if eos is None else self.token_to_id(eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        ids: list[int] = [self._bos] if add_special_tokens and self._bos is not None else []
        after_special = True  # llama.cpp: the space prefix goes on the first piece and after each token
        encode = self._sp.encode
        for piece, token in self._partition(text):
            if token is not None:
                ids.append(token)
                after_special = True
                continue
            if self._prefix and after_special:
                piece = " " + piece
            ids += encode(piece)
            after_special = False
        if add_special_tokens and self._eos is not None:
            ids.append(self._eos)
        return _Encoding(ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        size, special = self._size, self._special_ids
        ids = [i for i in ids if 0 <= i < size and not (skip_special_tokens and i in special)]
        pieces = self._sp.id_to_piece(ids) if ids else []
        out: list[str] = []
        pending = bytearray()
        for piece in pieces:
            if len(piece) == 6 and _BYTE_PIECE.fullmatch(piece):
                pending.append(int(piece[3:5], 16))
                continue
            if pending:
                out.append(_bytes_text(pending))
                pending = bytearray()
            out.append(piece.replace(SPACE, " "))
        if pending:
            out.append(_bytes_text(pending))
        text = "".join(out)
        return text[1:] if self._prefix and text.startswith(" ") else text

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._size

    def id_to_token(self, index: int) -> str | None:
        return self._sp.id_to_piece(index) if 0 <= index < self._size else None

    def token_to_id(self, text: str) -> int | None:
        index = self._marked.get(text)
        if index is None:
            index = self._sp.piece_to_id(text)
            if self._sp.id_to_piece(index) != text:  # sentencepiece answers the unknown id for a miss
                return None
        return index

    # ---- pickling (copy.deepcopy too): the processor is made again from the proto ----------------
    def __getstate__(self) -> dict:
        state = dict(vars(self))
        del state["_sp"]
        return state

    def __setstate__(self, state: dict) -> None:
        import sentencepiece  # noqa: PLC0415

        vars(self).update(state)
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self.proto)

    # ---- the cache form --------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        head = json.dumps(self.header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return struct.pack("<I", len(head)) + head + self.proto

    @classmethod
    def from_bytes(cls, blob: bytes) -> "SpmBackend":
        (length,) = struct.unpack_from("<I", blob)
        header = json.loads(blob[4:4 + length].decode("utf-8"))
        return cls(header, blob[4 + length:])

    # ---- helpers --------------------------------------------------------------------------------
    def _index_marked(self) -> None:
        """The scan for marked tokens: a regex finds where one may start (its first two characters,
        or its only one), a dict lookup per candidate length (longest first) confirms it. Far
        cheaper to set up than one regex alternation of every token (~0.2 s for Gemma's 6,414),
        and two characters keep single spaces (Gemma marks runs of spaces) from being candidates."""
        lengths: dict[str, set[int]] = {}
        for text in self._marked:
            lengths.setdefault(text[:2], set()).add(len(text))
        self._lengths = {key: sorted(ls, reverse=True) for key, ls in lengths.items()}
        keys = sorted(lengths, key=len, reverse=True)  # two-character prefixes before single characters
        self._starts = re.compile("|".join(re.escape(k) for k in keys)) if keys else None

    def _partition(self, text: str):
        """(text, None) and (token text, id) pieces, marked tokens leftmost and longest first."""
        if self._starts is None:
            if text:
                yield text, None
            return
        marked, lengths, search = self._marked, self._lengths, self._starts.search
        start = at = 0
        while (found := search(text, at)) is not None:
            at = found.start()
            for key in (text[at:at + 2], text[at]):  # a longer token shares its first two characters
                index = None
                for length in lengths.get(key, ()):
                    index = marked.get(text[at:at + length])
                    if index is not None:
                        break
                if index is not None:
                    break
            if index is None:
                at += 1
                continue
            if at > start:
                yield text[start:at], None
            yield text[at:at + length], index
            start = at = at + length
        if start < len(text):
            yield text[start:], None


def _bytes_text(data: bytearray) -> str:
    """``tokenizers``' ByteFallback decoder: the bytes as UTF-8, or one U+FFFD per byte if they are not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)


def build_spm(metadata: Metadata) -> SpmBackend | None:
    """The ``sentencepiece`` backend for a ``llama`` vocabulary, or None (logged) when it cannot hold it."""
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    why = _unsupported(metadata, tokens, types)
    if why:
        log.debug("%s: tokenizing with `tokenizers`, not `sentencepiece`: %s", metadata.file, why)
        return None
    scores = metadata.get("tokenizer.ggml.scores")
    scores = [0.0] * len(tokens) if scores is None else [float(s) for s in scores]
    unknown = _unknown_id(metadata, types)
    control, user = marked_tokens(tokens, types)
    header = {"prefix": bool(metadata.get("tokenizer.ggml.add_space_prefix", True)),
              "control": [[i, tokens[i]] for i in control], "user": [[i, tokens[i]] for i in user]}
    try:
        return SpmBackend(header, model_proto(tokens, scores, spm_types(types, unknown)))
    except Exception as exc:  # noqa: BLE001 - sentencepiece refused the model: tokenizers encodes it instead
        warnings.warn(f"{metadata.file}: sentencepiece cannot load this vocabulary ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); tokenizing with `tokenizers` instead", stacklevel=4)
        return None


def _unknown_id(metadata: Metadata, types: list[int]) -> int | None:
    index = metadata.get("tokenizer.ggml.unknown_token_id")
    if index is not None and 0 <= index < len(types):
        return int(index)
    return next((i for i, kind in enumerate(types) if kind == UNKNOWN), None)


def _unsupported(metadata: Metadata, tokens: list[str], types: list[int]) -> str | None:
    """Why a ``ModelProto`` cannot hold this vocabulary as llama.cpp reads it (None: it can)."""
    if len(types) != len(tokens):
        return "token_type and tokens differ in length"
    if spm_types(types, 0) is None:
        return f"token types {sorted(set(types) - {1, 2, 3, 4, 5, 6})} have no sentencepiece counterpart"
    if len(set(tokens)) != len(tokens):
        return "a token is spelled twice (sentencepiece refuses duplicate pieces)"
    if not all(tokens):
        return "an empty token"
    if _unknown_id(metadata, types) is None:
        return "no unknown token (sentencepiece needs one)"
    # byte pieces must be BYTE pieces, all 256 of them: sentencepiece spells a missing character with them
    byte_ids = [i for i, kind in enumerate(types) if kind == BYTE]
    if sorted(tokens[i] for i in byte_ids) != [f"<0x{b:02X}>" for b in range(256)]:
        return "the 256 <0xXX> byte tokens are not all there, typed BYTE"
    return None
