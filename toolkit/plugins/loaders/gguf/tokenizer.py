"""A fast tokenizer built straight from GGUF metadata (``tokenizer.ggml.*``) that encodes as llama.cpp does.

The vocabulary, scores, token types and merges go into a ``tokenizers.Tokenizer`` (Rust),
wrapped with the file's special tokens and chat template in a ``GGUFTokenizer``
(``tokenizer_wrapper.py``: encodes and decodes without importing transformers, and builds the
``transformers.PreTrainedTokenizerFast`` when anything else is asked of it). The family follows ``tokenizer.ggml.model``, as in llama.cpp:

* ``llama``: SentencePiece (Llama 2, Gemma 3): ``▁`` for spaces, byte fallback, pieces merged
  best score first. Encoded by Google's ``sentencepiece`` when it is installed and can hold the
  vocabulary (``spm_tokenizer.py``: a ModelProto written from the GGUF arrays; a warm load of
  Gemma 3's 262k pieces takes ~0.1 s). Otherwise (or with ``$TOOLKIT_GGUF_SENTENCEPIECE=off``),
  and for transformers' wrapper, a ``tokenizers`` BPE with the same ids: files rarely store
  merges, so they are derived from the scores (``merges.py``), keeping only those that can ever
  apply (``merge_pruning.py``).
* ``gpt2`` (and ``gemma4``, ``whitespace``): BPE with the file's merges, the text split first by
  the regexes its ``tokenizer.ggml.pre`` names (``pretokenizers.py``); byte-level unless that
  pre-tokenizer keeps UTF-8 (SentencePiece-style vocabularies written as ``gpt2``).
* ``bert``: WordPiece (``wordpiece.py``); ``t5``: Unigram (``unigram.py``).

Building the Rust tokenizer is the costly part for large vocabularies; ``tokenizer_cache.py``
keeps the built one on disk keyed by the metadata it came from. ``build_backend`` is the
construction step alone (metadata already validated), ``build_tokenizer`` adds the cache and
the wrapper.
"""
from __future__ import annotations

import logging
import os
import warnings

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from .merge_pruning import applicable_merges
from .merges import sentencepiece_merges
from .metadata import Metadata
from .pretokenizers import GPT2, LLAMA3, QWEN2, PreTokenizer, pre_tokenizer_for
from .spm_tokenizer import marked_tokens

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # llama.cpp token types
SPM_ENV = "TOOLKIT_GGUF_SENTENCEPIECE"  # "0"/"off": SentencePiece vocabularies through `tokenizers` too
SPACE = "\u2581"  # SentencePiece's visible space
log = logging.getLogger(__name__)
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
# kept for callers that name a split by its regex
LLAMA3_SPLIT, QWEN2_SPLIT, GPT2_SPLIT = LLAMA3, QWEN2, GPT2
BPE_MODELS = ("gpt2", "gemma4", "whitespace")


def build_tokenizer(metadata: Metadata):
    """A ``GGUFTokenizer`` for the file (a ``PreTrainedTokenizerFast`` look-alike whose transformers
    half, ``.hf``, is built on first need), or None (with a warning) if it has no usable vocabulary."""
    if "tokenizer.ggml.tokens" not in metadata:
        return None
    from .tokenizer_cache import cached_backend  # noqa: PLC0415 - avoids an import cycle

    def tokenizers_backend():
        return cached_backend(metadata, build_backend)

    if metadata.get("tokenizer.ggml.model", "llama") == "llama" and use_sentencepiece():
        from .spm_tokenizer import build_spm  # noqa: PLC0415
        from .tokenizer_cache import cached_spm  # noqa: PLC0415

        spm = cached_spm(metadata, build_spm)
        if spm is not None:  # the `tokenizers` backend is built only if transformers' wrapper is asked for
            return _wrap(spm, metadata, tokenizers_backend)
    backend = tokenizers_backend()
    if backend is None:
        return None
    return _wrap(backend, metadata)


def use_sentencepiece() -> bool:
    """Whether ``llama`` vocabularies go to ``sentencepiece`` (installed, and not turned off by
    ``$TOOLKIT_GGUF_SENTENCEPIECE``); otherwise ``tokenizers`` encodes them, with the same ids."""
    if os.environ.get(SPM_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return False
    from .spm_tokenizer import available  # noqa: PLC0415

    if not available():
        log.debug("sentencepiece is not installed: SentencePiece GGUF vocabularies load through `tokenizers`")
        return False
    return True


def build_backend(metadata: Metadata) -> Tokenizer | None:
    """The ``tokenizers.Tokenizer`` for the file's vocabulary (None, with a warning, if its model is unknown)."""
    kind = metadata.get("tokenizer.ggml.model", "llama")
    if kind in BPE_MODELS:
        label = "gemma4" if kind == "gemma4" else "whitespace" if kind == "whitespace" \
            else metadata.get("tokenizer.ggml.pre")
        pre, warning = pre_tokenizer_for(label)
        if warning:
            warnings.warn(f"{metadata.file}: {warning}", stacklevel=3)
        build = _byte_level if pre.byte_encode else _utf8_bpe
        return build(metadata, list(metadata["tokenizer.ggml.tokens"]), pre)
    if kind == "llama":
        return _sentencepiece(metadata, list(metadata["tokenizer.ggml.tokens"]))
    if kind == "bert":
        from .wordpiece import wordpiece  # noqa: PLC0415
        return wordpiece(metadata, list(metadata["tokenizer.ggml.tokens"]))
    if kind == "t5":
        from .unigram import unigram  # noqa: PLC0415
        return unigram(metadata, list(metadata["tokenizer.ggml.tokens"]))
    warnings.warn(f"{metadata.file}: GGUF tokenizer model {kind!r} is not supported "
                  f"(llama, {', '.join(BPE_MODELS)}, bert, t5); pass --tokenizer to use another", stacklevel=3)
    return None


def _sentencepiece(metadata: Metadata, tokens: list[str]) -> Tokenizer:
    # Gemma's all-space pieces are stored with real spaces; llama.cpp looks up "▁" runs, so never
    # produces them, and neither do we
    vocab = _vocab(tokens)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    # byte fallback spells any character the vocabulary lacks, so the unk token is a formality
    options = dict(fuse_unk=True, byte_fallback=True, dropout=None,
                   unk_token=tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None)
    # of the ~2 merges per piece, only the one each piece forms by can apply: the rest only cost
    # every load of the cached tokenizer their reading (merge_pruning.py says why ids stay the same)
    merges = applicable_merges(_sentencepiece_merges(metadata, tokens, vocab), vocab, **options)
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, **options))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    # llama.cpp: a leading space unless the file says otherwise; every space becomes "▁" before merging
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    if prefix:
        backend.normalizer = normalizers.Sequence([normalizers.Prepend(" "), normalizers.Replace(" ", SPACE)])
        steps.append(decoders.Strip(content=" ", left=1))
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.decoder = decoders.Sequence(steps)
    _add_marked_tokens(backend, tokens, metadata)
    return backend


def _vocab(tokens: list[str]) -> dict[str, int]:
    """token -> id; a token spelled twice keeps its last id, as llama.cpp's text_to_token does."""
    return {token: index for index, token in enumerate(tokens)}


def _sentencepiece_merges(metadata: Metadata, tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges llama.cpp's score-driven SentencePiece merging follows: every split of a piece into
    two pieces, best score of the whole first (ties: earlier token first)."""
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None:  # no scores: llama.cpp scores every piece 0.0; file order then breaks ties
        scores = [0.0] * len(tokens)
    ranked: dict[str, float] = {}
    for token, score in zip(tokens, scores):
        ranked.setdefault(token, float(score))
    # a piece holding a space (Gemma's all-space pieces) never meets the model: the normalizer has
    # turned every space into "▁" first, so merges of such pieces could never apply. Leaving them
    # out keeps every merge writable as "left right" (the faster cache form, tokenizer_cache.py).
    return [(left, right) for left, right in sentencepiece_merges(vocab, ranked) if " " not in left and " " not in right]


def _bpe_merges(metadata: Metadata, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The file's merges in rank order, without those ``tokenizers`` cannot hold (a side or the
    result missing from the vocabulary: llama.cpp's merge would only lead to byte tokens)."""
    merges = []
    for merge in metadata.get("tokenizer.ggml.merges", []):
        cut = merge.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if cut < 0:
            continue
        left, right = merge[:cut], merge[cut + 1:]
        if left in vocab and right in vocab and left + right in vocab:
            merges.append((left, right))
    return merges


def _splits(pre: PreTokenizer) -> list:
    return [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in pre.regexes]


def _byte_level(metadata: Metadata, tokens: list[str], pre: PreTokenizer) -> Tokenizer:
    # tokens are looked up as spelled, like llama.cpp: a normal token outside the byte alphabet is
    # never produced by byte-level BPE; control and user-defined ones are matched in the raw text
    vocab = _vocab(tokens)
    backend = Tokenizer(BPE(vocab=vocab, merges=_bpe_merges(metadata, vocab), dropout=None,
                            continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                            ignore_merges=pre.ignore_merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence(_splits(pre) + [
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    _add_marked_tokens(backend, tokens, metadata)
    return backend


def _utf8_bpe(metadata: Metadata, tokens: list[str], pre: PreTokenizer) -> Tokenizer:
    """BPE over raw UTF-8 with ``<0xXX>`` byte fallback (a SentencePiece-style vocabulary in a
    ``gpt2`` file: Gemma 4, or llama.cpp's converter given a SentencePiece tokenizer.json)."""
    vocab = _vocab(tokens)
    backend = Tokenizer(BPE(vocab=vocab, merges=_bpe_merges(metadata, vocab), dropout=None, byte_fallback=True,
                            fuse_unk=False, ignore_merges=pre.ignore_merges))
    if pre.escape_whitespace:
        backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.pre_tokenizer = pre_tokenizers.Sequence(_splits(pre))
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    _add_marked_tokens(backend, tokens, metadata)
    return backend


def _add_marked_tokens(backend: Tokenizer, tokens: list[str], metadata: Metadata) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens: both are
    matched whole in the text (llama-tokenize parses special tokens by default), never cut by BPE."""
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    control, user = marked_tokens(tokens, types)
    backend.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in control])
    backend.add_tokens([AddedToken(tokens[i], normalized=False, special=False) for i in user])


def _wrap(backend, metadata: Metadata, tokenizers_backend=None):
    """The file's special tokens, add-BOS/EOS rules and chat template around the backend (transformers'
    wrapper only once something needs it: ``tokenizer_wrapper.py``). ``backend`` is a
    ``tokenizers.Tokenizer`` or an ``SpmBackend``; for the latter, ``tokenizers_backend()`` builds the
    ``tokenizers`` one that transformers' wrapper needs."""
    from .tokenizer_wrapper import GGUFTokenizer  # noqa: PLC0415

    size = backend.get_vocab_size(with_added_tokens=True)

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return backend.id_to_token(index) if index is not None and 0 <= index < size else None

    kind = metadata.get("tokenizer.ggml.model", "llama")
    # llama.cpp adds BOS to SentencePiece and WordPiece vocabularies, and to some pre-tokenizer types,
    # unless the file says otherwise (Gemma 4's type adds it regardless)
    add_bos = kind in ("llama", "bert")
    if kind in BPE_MODELS:
        pre = pre_tokenizer_for("gemma4" if kind == "gemma4" else metadata.get("tokenizer.ggml.pre"))[0]
        add_bos = bool(pre.add_bos)
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos))
    if kind in BPE_MODELS and pre.force_bos:
        add_bos = True
    eos, add_eos = token("eos_token_id"), bool(metadata.get("tokenizer.ggml.add_eos_token", kind == "t5"))
    if kind == "bert":  # llama.cpp closes WordPiece text with the separator token
        eos, add_eos = token("seperator_token_id") or eos, bool(metadata.get("tokenizer.ggml.add_sep_token", True))
    specials = dict(bos_token=token("bos_token_id"), eos_token=eos, unk_token=token("unknown_token_id"),
                    pad_token=token("padding_token_id"))
    # the file's own label, for a GGUF writer to keep (the split alone cannot tell smollm from starcoder)
    return GGUFTokenizer(backend, specials=specials, add_bos_token=add_bos, add_eos_token=add_eos,
                         chat_template=metadata.get("tokenizer.chat_template"),
                         gguf_pre=metadata.get("tokenizer.ggml.pre"), tokenizers_backend=tokenizers_backend)
