"""A Qwen2-shaped byte-level BPE vocabulary as a vocabulary-only GGUF, for timing tokenizer builds.

151,643 tokens (256 byte symbols + 151,387 synthetic merges: pairs of earlier tokens, skewed to
short ones, at most 16 characters, mean 6.6) + 22 control tokens; ``tokenizer.ggml.model = gpt2``,
``pre = qwen2``. No real Qwen vocabulary is at hand on the benchmark machine; load time depends
on the counts and lengths, not on which strings they are.

    python bench/make_qwen_shaped_vocab.py /tmp/qwen_shaped.gguf
    python bench/bench_tokenizer_build.py /tmp/qwen_shaped.gguf --repeats 5 --backend tokenizers
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gguf_llamacpp import write_gguf  # noqa: E402 - the tests' vocabulary-only GGUF writer (gguf-py)


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def main() -> None:
    rng = random.Random(0)
    tokens = byte_alphabet()
    seen, merges = set(tokens), []
    while len(merges) < 151_387:
        left = tokens[int(len(tokens) * rng.random() ** 6)]
        right = tokens[int(len(tokens) * rng.random() ** 6)]
        if left + right in seen or len(left + right) > 16:
            continue
        seen.add(left + right)
        tokens.append(left + right)
        merges.append(f"{left} {right}")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(19)]
    vocab = {"tokens": tokens + specials, "types": [1] * len(tokens) + [3] * len(specials), "merges": merges,
             "ids": {"bos_token_id": len(tokens), "eos_token_id": len(tokens) + 2}}
    write_gguf(Path(sys.argv[1]), vocab, model="gpt2", pre="qwen2")
    print(f"{sys.argv[1]}: {len(vocab['tokens'])} tokens, {len(merges)} merges, "
          f"mean length {sum(map(len, tokens)) / len(tokens):.1f}")


if __name__ == "__main__":
    main()
