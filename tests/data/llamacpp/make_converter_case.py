"""Make the llama.cpp-converter case of test_gguf_llamacpp_converter.py (run by hand, not by the tests).

    python tests/data/llamacpp/make_converter_case.py LLAMA_CPP_DIR

1. A tiny random Gemma 3 in Hugging Face form whose tokenizer is only a tokenizer.json (a
   SentencePiece-style BPE, as any Gemma directory toolkit exports): converter/hf/.
2. llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python 0.3.36 sdist, its gguf-py on
   PYTHONPATH) turns it into converter/gemma3-tiny-f32.gguf, run as
       PYTHONPATH=LLAMA_CPP_DIR/gguf-py python run_converter.py LLAMA_CPP_DIR converter/hf --outtype f32
   The converter recognizes pre-tokenizers by hashing the tokens of a probe text, which no tiny
   vocabulary matches; run_converter.py answers that lookup with "granite-embed-multi-311m", the
   label the converter gives real Gemma tokenizer.json files (issue 13), and changes nothing else.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent / "converter"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def make_hf(path: Path) -> None:
    import torch
    import transformers as tf

    from test_gguf_convert import randomize, sentencepiece_tokenizer

    tokenizer = _plain_byte_pieces(sentencepiece_tokenizer(gemma=True))
    config = tf.Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                 query_pre_attn_scalar=16, sliding_window=4, max_position_embeddings=256,
                                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = randomize(tf.Gemma3ForCausalLM(config), embed_std=0.1 / 8)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    for extra in ("special_tokens_map.json", "generation_config.json"):
        (path / extra).unlink(missing_ok=True)


def _plain_byte_pieces(tokenizer):
    """Gemma's <0xNN> pieces are ordinary vocabulary entries, not added tokens (the converter
    would decode added ones to raw bytes, and llama.cpp refuses the duplicates that makes)."""
    import json

    import transformers as tf
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if not t["content"].startswith("<0x")]
    return tf.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                      eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def main() -> None:
    llama_cpp = Path(sys.argv[1])
    make_hf(HERE / "hf")
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py")}
    subprocess.run([sys.executable, str(Path(__file__).parent / "run_converter.py"), str(llama_cpp), str(HERE / "hf"),
                    "--outtype", "f32", "--outfile", str(HERE / "gemma3-tiny-f32.gguf")], check=True, env=env)


if __name__ == "__main__":
    main()
