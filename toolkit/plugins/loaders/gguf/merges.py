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
    pieces = list(scores)
    owners: list[int] = []  # the token each merge makes (its index in ``scores``)
    cuts: list[int] = []  # where that token is cut
    add_owner, add_cut = owners.append, cuts.append
    for order, token in enumerate(pieces):
        for cut in range(1, len(token)):
            # most prefixes are not pieces: the right side is sliced only when the left one is
            if token[:cut] in vocab and token[cut:] in vocab:
                add_owner(order)
                add_cut(cut)
    if not owners:
        return []
    owner = np.array(owners, dtype=np.int64)
    cut = np.array(cuts, dtype=np.int64)
    score = np.fromiter(scores.values(), dtype=np.float64, count=len(pieces))[owner]
    length = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))[owner]
    # lexsort's last key is the primary one; negate for "descending"
    ranked = np.lexsort((owner, -(length - cut), -cut, -score))
    return [(pieces[o][:c], pieces[o][c:]) for o, c in zip(owner[ranked].tolist(), cut[ranked].tolist())]


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
