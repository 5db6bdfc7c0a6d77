"""llama.cpp's convert_hf_to_gguf.py with one answer supplied: the pre-tokenizer label.

    python run_converter.py LLAMA_CPP_DIR HF_DIR [converter options...]

The converter names a BPE pre-tokenizer by hashing its tokens of a probe text; a tiny test
vocabulary matches no known hash, so its lookup (``get_vocab_base_pre``) answers
"granite-embed-multi-311m", what the converter picks for real Gemma 3 tokenizer.json files.
"""
import sys
from pathlib import Path

llama_cpp = Path(sys.argv.pop(1))
sys.path.insert(0, str(llama_cpp))
import conversion.base as base  # noqa: E402  (llama.cpp's converter package)

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "granite-embed-multi-311m"
import convert_hf_to_gguf  # noqa: E402

convert_hf_to_gguf.main()
