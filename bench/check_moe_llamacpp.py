"""Check that llama.cpp runs MoE GGUF files written by ``toolkit convert``: tiny random Qwen3-MoE,
Qwen2-MoE and Mixtral (transformers' save_pretrained, with a byte-level BPE tokenizer), converted
to F32 and Q8_0, evaluated by llama.cpp through llama-cpp-python, logits compared with transformers.

Not a CI test (needs a llama.cpp build). Command used for docs/moe.md (CPU build of libllama 0.25.3):

    LLAMA_CPP_LIB_PATH=/work/dl/llama-cpu-build/bin PYTHONPATH=/work/dl/llama_cpp_python-0.3.36 \
        OMP_NUM_THREADS=1 .venv/bin/python bench/check_moe_llamacpp.py
"""
import pathlib
import sys

import numpy as np
import torch
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from moe_fixtures import save_moe_model, VOCAB
from toolkit.core.convert import convert
from llama_cpp import Llama
import tempfile
ids = list(range(3, 20))
for kind, extra in [("qwen3_moe", dict(mlp_only_layers=[])), ("qwen2_moe", dict(decoder_sparse_step=1)), ("mixtral", {})]:
    d = pathlib.Path(tempfile.mkdtemp())
    from conftest import save_tiny_tokenizer
    vocab = save_tiny_tokenizer(d / "hf", 511)
    ref = save_moe_model(d / "hf", kind, hidden=256, expert_ffn=256, layers=2, vocab_size=vocab, **extra)
    with torch.no_grad():
        exp = ref(torch.tensor([ids])).logits[0]
    for t in ("F32", "Q8_0"):
        convert(d / "hf", d / f"m{t}.gguf", to=f"gguf:{t}")
        m = Llama(str(d / f"m{t}.gguf"), n_ctx=64, verbose=False, logits_all=True, n_threads=1)
        m.eval(ids)
        s = torch.from_numpy(np.asarray(m.scores[:len(ids)]).copy())
        print(kind, t, "llama.cpp vs transformers max diff", (s - exp).abs().max().item(), "scale", exp.abs().max().item(),
              "argmax equal", bool((s.argmax(-1) == exp.argmax(-1)).all()))
