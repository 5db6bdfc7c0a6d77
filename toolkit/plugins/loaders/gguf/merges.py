"""Vocabulary helpers for GGUF tokenizers: SentencePiece merges and the byte-level alphabet."""
from __future__ import annotations

import functools

import numpy as np


def sentencepiece_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies, best first.

    Every way of cutting a token into two vocabulary pieces is a merge ranked by that token's
    score (higher first); ties go to the longer left piece, then the longer right piece, then the
    order of ``scores``. This is the order SentencePiece-to-BPE conversion (and transformers)
    uses, so the tokenizer encodes the same way.
    """
    lefts: list[str] = []
    rights: list[str] = []
    keys: list[tuple[float, int, int, int]] = []
    add_left, add_right, add_key = lefts.append, rights.append, keys.append
    for order, (token, score) in enumerate(scores.items()):
        length = len(token)
        for cut in range(1, length):
            left = token[:cut]
            if left in vocab:  # most prefixes are not pieces: skip building the right side
                right = token[cut:]
                if right in vocab:
                    add_left(left)
                    add_right(right)
                    add_key((score, cut, length - cut, order))
    if not keys:
        return []
    table = np.array(keys, dtype=np.float64)
    # lexsort's last key is the primary one; negate for "descending"
    ranked = np.lexsort((table[:, 3], -table[:, 2], -table[:, 1], -table[:, 0]))
    return [(lefts[i], rights[i]) for i in ranked.tolist()]


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> tuple[frozenset[str], tuple[str, ...]]:
    """GPT-2's printable spelling of the 256 byte values: (the alphabet, spelling by byte).

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) are moved to
    code points 256 and up, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelling: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in spelling:
            spelling[byte] = chr(256 + shifted)
            shifted += 1
    by_byte = tuple(spelling[b] for b in range(256))
    return frozenset(by_byte), by_byte
