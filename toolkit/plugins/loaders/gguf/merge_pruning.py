"""Leaving out the SentencePiece merges that can never apply, so the built tokenizer loads faster.

A SentencePiece vocabulary implies a merge for every way of cutting a piece into two pieces
(``merges.sentencepiece_merges``): 514,441 for Gemma 3's 262,144 tokens. ``tokenizers`` spends
about half of a cached tokenizer's load reading and hashing them, yet at most one merge per piece
can ever apply. Why, for the ``tokenizers`` BPE model (no dropout, no ``ignore_merges``), which
merges the best-ranked adjacent pair, leftmost first, until none is left:

* Where a piece ``T`` forms inside a longer text, no merge crossed its edges before it formed,
  and a merge outside its span never changes the pairs inside it. So the merges inside the span
  are exactly those of encoding ``T``'s text alone, in the same order: ``T`` always forms the same
  way, through the last merge of encoding its own text (if that text encodes to ``T`` at all).
* That last merge is found with ``tokenizers`` itself: encode ``T``'s text with a model holding
  only the merges of shorter pieces. Every merge before the last one makes a shorter piece, and
  the last one is the only merge left that could join the two pieces it ends with, so the
  encoding stops there, at exactly two pieces ``(A, B)``. ``(A, B)`` is kept; ``T``'s other cuts are
  not (nor any of them if the encoding is not one of ``T``'s cuts: ``T`` never forms).
* A model holding every merge that ever applies, in the same relative order, makes the same
  choice at every step as the full one (the best pair the full model merges is in it, and it has
  no pair the full model lacks), so it gives the same ids for every text.

Pieces are done shortest first, each model holding the merges kept so far. The argument needs
every initial symbol to be the piece spelled by its character: a merge with a byte-fallback
token (``<0x41>``) or the unknown token on either side could join symbols spelled differently,
so such a vocabulary keeps all its merges. A length whose pieces have few cuts beyond one each keeps
them all (a superset of the merges that apply changes nothing either): its model would cost the
cold build more than the cuts cost each load.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from tokenizers import Tokenizer
from tokenizers.models import BPE

BYTE_TOKENS = frozenset(f"<0x{byte:02X}>" for byte in range(256))  # what ``byte_fallback`` looks up
MIN_SAVED = 16384  # a length whose pieces have fewer cuts beyond one each keeps them all (its model would cost more)


def applicable_merges(merges: list[tuple[str, str]], vocab: dict[str, int], *, min_saved: int | None = None,
                      **bpe_options) -> list[tuple[str, str]]:
    """The merges of ``merges`` (rank order) that a ``BPE(vocab, merges, **bpe_options)`` can ever
    apply, in the same order: a BPE built from them encodes every text as the full one does.
    Pieces of a length whose surplus cuts number fewer than ``min_saved`` (``MIN_SAVED``) keep all their cuts."""
    min_saved = MIN_SAVED if min_saved is None else min_saved
    unk = bpe_options.get("unk_token")
    if any(bpe_options.get(option) for option in ("dropout", "ignore_merges", "continuing_subword_prefix",
                                                     "end_of_word_suffix")):
        return merges
    # the symbols a text can start as besides its characters
    fallback = BYTE_TOKENS | ({unk} if unk is not None else set())
    if any(left in fallback or right in fallback for left, right in merges):
        return merges
    count = len(merges)
    left = np.fromiter((vocab[a] for a, _ in merges), dtype=np.int64, count=count)
    right = np.fromiter((vocab[b] for _, b in merges), dtype=np.int64, count=count)
    made = np.fromiter((vocab[a + b] for a, b in merges), dtype=np.int64, count=count)
    length = np.fromiter((len(a) + len(b) for a, b in merges), dtype=np.int64, count=count)
    pair = left << 32 | right  # a cut as one int (see _last_pairs)
    pieces_by_length: dict[int, dict[str, int]] = defaultdict(dict)
    for piece, index in vocab.items():
        pieces_by_length[len(piece)][piece] = index
    known = {piece: vocab[piece] for piece in fallback if piece in vocab}  # each model's vocabulary
    keep = np.ones(count, dtype=bool)
    known_below = 1  # ``known`` holds every piece shorter than this
    for size in np.unique(length).tolist():
        indices = np.flatnonzero(length == size)
        first_cuts = np.unique(made[indices], return_index=True)[1]  # one cut of each piece
        if len(indices) - len(first_cuts) < min_saved:
            continue
        for shorter in range(known_below, size):
            known.update(pieces_by_length.get(shorter, {}))
        known_below = size
        below = np.flatnonzero(keep & (length < size)).tolist()
        model = BPE(vocab=dict(known), merges=[merges[i] for i in below], **bpe_options)
        texts = [merges[i][0] + merges[i][1] for i in indices[first_cuts].tolist()]
        # a two-piece encoding of a piece's text is a cut of that piece, and only its own
        keep[indices] = np.isin(pair[indices], _last_pairs(model, texts))
    return [merge for merge, kept in zip(merges, keep.tolist()) if kept]


def _last_pairs(model: BPE, texts: list[str]) -> np.ndarray:
    """For each of ``texts`` that ``model`` encodes as exactly two pieces, those pieces' ids as one
    int (``left << 32 | right``: ints, not tuples, so the garbage collector has nothing to walk)."""
    # one call: each text is its own word (``is_pretokenized``), encoded by the model alone
    encoding = Tokenizer(model).encode(texts, is_pretokenized=True, add_special_tokens=False)
    words = np.asarray(encoding.word_ids, dtype=np.int64)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])  # where each word's pieces start
    two = first[np.diff(np.r_[first, len(words)]) == 2]
    return ids[two] << 32 | ids[two + 1]
