"""WordPiece (``tokenizer.ggml.model = bert``) from GGUF metadata, encoding as llama.cpp does.

llama.cpp's converter stores a BERT vocabulary with word-initial pieces spelled ``▁piece`` and
continuation pieces without their ``##``; its tokenizer lowercases and strips accents (unless
``tokenizer.ggml.normalizer.*`` say otherwise), drops control characters, splits on whitespace,
punctuation, ASCII symbols and CJK characters, and matches each word longest piece first, the
whole word becoming the unknown token when some part of it matches nothing; [CLS] and [SEP]
(the wrapper's BOS and EOS) enclose the text. ``tokenizers``'
WordPiece does the same with the pieces respelled the BERT way (``piece`` / ``##piece``).
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordPiece

from .metadata import Metadata

SPACE = "\u2581"
CONTROL, USER_DEFINED = 3, 4


def wordpiece(metadata: Metadata, tokens: list[str]) -> Tokenizer:
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    spelled = [t if kind in (CONTROL, USER_DEFINED) else t[1:] if t.startswith(SPACE) and len(t) > 1 else f"##{t}"
               for t, kind in zip(tokens, types)]
    vocab = {token: index for index, token in enumerate(spelled)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 100)
    backend = Tokenizer(WordPiece(vocab=vocab, unk_token=spelled[unk_id] if unk_id < len(spelled) else "[UNK]",
                                  max_input_chars_per_word=1 << 30))
    lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    steps = [normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                        lowercase=lowercase)]
    if strip:
        # llama.cpp's decomposition keeps one code point per character, the first of its canonical
        # decomposition: marks go (spacing ones too, unlike BertNormalizer's strip_accents), and a
        # Hangul syllable keeps only its leading consonant
        steps += [normalizers.NFD(), normalizers.Replace(Regex("[\\p{M}\u1161-\u1175\u11a8-\u11c2]"), "")]
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, kind in zip(spelled, types) if kind == CONTROL and t])
    return backend
