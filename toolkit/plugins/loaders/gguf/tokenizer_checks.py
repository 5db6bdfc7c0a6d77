"""GGUF tokenizer metadata (``tokenizer.ggml.*``), checked when the file is opened.

The tokenizer is built after every weight has loaded; a broken vocabulary must not cost that
load, nor surface as an error from deep inside the ``tokenizers`` library. This runs first and
checks what the tokenizer builder relies on: the token list is an array of UTF-8 strings, scores
and token types (when present) are numeric arrays of the same length, scores exist where merges
must be derived from them, merges are ``"left right"`` pairs of vocabulary pieces, special token
ids are integers inside the vocabulary. It is kept apart from ``tokenizer.py`` (the builder) so
that either can change without the other.
"""
from __future__ import annotations

import math

import numpy as np

from gguf import GGUFValueType

from toolkit.core import validate as v
from toolkit.core.errors import InvalidConfigError, MissingMetadataError

from .metadata import Metadata

PREFIX = "tokenizer.ggml."
TOKEN_IDS = ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id",
             "padding_token_id", "sep_token_id", "cls_token_id", "mask_token_id")
FLAGS = ("add_bos_token", "add_eos_token", "add_space_prefix")
TEXTS = ("model", "pre")
NUMERIC = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
           GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
           GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}
INTEGER = NUMERIC - {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}
CHECKED = "_tokenizer_checked"  # set on a Metadata that passed every check
# Architectures whose SentencePiece merges come from the token order, not the scores (see tokenizer.py)
ORDER_MERGES_ARCHS = ("gemma", "gemma2", "gemma3")


def check_tokenizer_metadata(metadata: Metadata, *, trust_cache: bool = True) -> None:
    """InvalidConfigError / MissingMetadataError / CorruptFileError naming the file and the key.

    Metadata is read-only, so a ``Metadata`` that passed once is not checked again. With
    ``trust_cache``, metadata whose exact bytes the tokenizer cache holds an entry for passed these
    checks when that entry was written (``tokenizer_cache.checked_before``), so only the chat
    template (not part of the cache key) is checked."""
    tokens_key = PREFIX + "tokens"
    if tokens_key not in metadata:
        return
    file = metadata.file
    if "tokenizer.chat_template" in metadata:
        v.text(metadata["tokenizer.chat_template"], key="tokenizer.chat_template", file=file, allow_empty=True)
    if vars(metadata).get(CHECKED):
        return
    if trust_cache:
        from .tokenizer_cache import checked_before  # noqa: PLC0415 - imports tokenizers, which the plugin's import need not

        if checked_before(metadata):
            return
    _expect_array(metadata, tokens_key, {GGUFValueType.STRING}, "strings")
    if PREFIX + "merges" in metadata:
        metadata[tokens_key]  # the merge check needs the strings (decoding errors are typed by Metadata)
    else:
        metadata.check_decodable(tokens_key)  # without making 262k strings a cached tokenizer never needs
    count = metadata.length(tokens_key)
    if not count:
        raise InvalidConfigError("the token list is empty", file=file, key=tokens_key)
    for suffix in TEXTS:
        if PREFIX + suffix in metadata:
            v.text(metadata[PREFIX + suffix], key=PREFIX + suffix, file=file)
    for suffix in FLAGS:
        if PREFIX + suffix in metadata:
            v.flag(metadata[PREFIX + suffix], key=PREFIX + suffix, file=file)
    for suffix in TOKEN_IDS:
        if PREFIX + suffix in metadata:
            v.integer(metadata[PREFIX + suffix], key=PREFIX + suffix, file=file, minimum=0, maximum=count - 1)
    _check_parallel_arrays(metadata, count)
    # llama.cpp stores SentencePiece spaces as " " in some vocabularies (Gemma) and "\u2581" in merges
    if PREFIX + "merges" in metadata:
        tokens = metadata[tokens_key]
        _check_merges(metadata, set(tokens) | {token.replace(" ", "\u2581") for token in tokens})
    _check_scores_needed(metadata)
    vars(metadata)[CHECKED] = True


def _expect_array(metadata: Metadata, key: str, item_types: set, what: str) -> None:
    field = metadata._fields[key]  # noqa: SLF001 - the types, without decoding the values
    types = list(field.types)
    if not types or types[0] != GGUFValueType.ARRAY or len(types) != 2 or types[1] not in item_types:
        found = "/".join(t.name for t in types) or "nothing"
        raise InvalidConfigError(f"expected an array of {what}, found {found}", file=metadata.file, key=key)


def _check_parallel_arrays(metadata: Metadata, count: int) -> None:
    """scores (numbers) and token_type (integers), one per token."""
    for suffix, types, what in (("scores", NUMERIC, "numbers"), ("token_type", INTEGER, "integers")):
        key = PREFIX + suffix
        if key not in metadata:
            continue
        _expect_array(metadata, key, types, what)
        length = metadata.length(key)
        if length != count:
            raise InvalidConfigError(f"{length} entries for {count} tokens", file=metadata.file, key=key)
    if PREFIX + "scores" in metadata:
        values = getattr(metadata.field(PREFIX + "scores"), "values", None)  # a bulk field's numpy view
        if values is not None:
            finite = np.isfinite(values.astype(np.float64))
            bad = None if finite.all() else int(np.flatnonzero(~finite)[0])
        else:
            bad = next((i for i, s in enumerate(metadata[PREFIX + "scores"]) if not math.isfinite(float(s))), None)
        if bad is not None:
            raise InvalidConfigError(f"score of token {bad} is not finite", file=metadata.file, key=PREFIX + "scores")


def _check_merges(metadata: Metadata, vocabulary: set[str]) -> None:
    key = PREFIX + "merges"
    if key not in metadata:
        return
    _expect_array(metadata, key, {GGUFValueType.STRING}, "strings")
    for index, merge in enumerate(metadata[key]):
        parts = merge.split(" ", 1)
        if len(parts) != 2 or not all(parts):
            raise InvalidConfigError(f"merge {index} ({merge[:40]!r}) is not two pieces separated by one space",
                                     file=metadata.file, key=key)
        missing = next((p for p in (*parts, parts[0] + parts[1]) if p not in vocabulary), None)
        if missing is not None:
            raise InvalidConfigError(f"merge {index} ({merge[:40]!r}) uses {missing[:40]!r}, which is not a token",
                                     file=metadata.file, key=key)


def _check_scores_needed(metadata: Metadata) -> None:
    """A SentencePiece vocabulary without merges derives them from the scores, so it needs them."""
    kind = metadata.get(PREFIX + "model", "llama")
    if kind != "llama" or PREFIX + "merges" in metadata or PREFIX + "scores" in metadata:
        return
    if metadata.get("general.architecture") in ORDER_MERGES_ARCHS:
        return
    raise MissingMetadataError("a SentencePiece ('llama') vocabulary without merges needs tokenizer.ggml.scores",
                               file=metadata.file, key=PREFIX + "scores")
