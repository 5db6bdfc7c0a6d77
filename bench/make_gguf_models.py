"""Synthetic Llama-shaped GGUF files with random weights, written by our own converter.

The comparison with llama.cpp (``bench/bench_vs_llamacpp.py``) needs the same bytes for both
engines at realistic sizes, without downloading a model. This writes a random Llama checkpoint
(safetensors, bf16, ``config.json``, a small byte-level BPE tokenizer; token ids past it become
``[PAD{i}]`` tokens in the GGUF, as llama.cpp pads them), then runs ``toolkit.core.convert``
to GGUF (our quantizer runs on the GPU when there is one). llama.cpp reads these files.

    python bench/make_gguf_models.py --out /tmp/models                      # the three default files
    python bench/make_gguf_models.py --out /tmp/models --models 1.5B:Q4_0 1.5B:F16 --keep-safetensors

Each model is ``SIZE:TYPE`` with SIZE one of ``SHAPES`` and TYPE a ``--to gguf:TYPE`` target
(Q4_0, Q4_K_M, Q8_0, F16, ...). ``--keep-safetensors`` leaves the source checkpoint beside the
GGUF (``SIZE-bf16/``), which the F16-vs-safetensors comparison loads.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

# Llama-shaped sizes (hidden, intermediate, layers, heads, kv heads, vocab). "8B" is Llama 3 8B's
# shape; "1.5B" is hidden 2048 x 24 layers with a 32000 vocabulary, untied (1.6B parameters).
SHAPES = {
    "tiny": (256, 768, 2, 4, 2, 1024),
    "1.1B": (2048, 5632, 22, 32, 4, 32000),
    "1.5B": (2048, 8192, 24, 32, 8, 32000),
    "8B": (4096, 14336, 32, 32, 8, 128256),
    "8B-4L": (4096, 14336, 4, 32, 8, 128256),   # 8B's matmul shapes in 4 layers: quick engine A/B of kernels
}
DEFAULT_MODELS = ("1.5B:Q4_0", "1.5B:Q4_K_M", "8B:Q4_K_M")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a synthetic model.",
          "Numbers 0123456789 and symbols !?.,;:()[]{}", "llama.cpp and toolkit read the same bytes."] * 8


def tokenizer():
    """A byte-level BPE (Llama 3 split regex) trained on a few sentences: ~300 tokens."""
    import transformers as tf  # noqa: PLC0415
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    from toolkit.plugins.loaders.gguf.tokenizer import LLAMA3_SPLIT  # noqa: PLC0415

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                            show_progress=False))
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=specials[0], eos_token=specials[1])


def write_checkpoint(path: Path, size: str, seed: int = 0) -> None:
    """A random bf16 Llama checkpoint of shape ``SHAPES[size]`` (weights ~N(0, 0.02), norms ~1)."""
    import transformers as tf  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    hidden, inter, layers, heads, kv_heads, vocab = SHAPES[size]
    path.mkdir(parents=True, exist_ok=True)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                            rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0,
                            eos_token_id=1, torch_dtype="bfloat16")
    config.save_pretrained(path)
    tokenizer().save_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(seed)
    head_dim = hidden // heads

    def weight(*shape):
        return (torch.randn(*shape, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()

    def norm():
        return (1 + 0.1 * torch.randn(hidden, generator=generator, device=device)).to(torch.bfloat16).cpu()

    shard = {"model.embed_tokens.weight": weight(vocab, hidden), "model.norm.weight": norm(),
             "lm_head.weight": weight(vocab, hidden)}
    files, index = [], {}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        shard.update({prefix + "self_attn.q_proj.weight": weight(heads * head_dim, hidden),
                      prefix + "self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
                      prefix + "self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
                      prefix + "self_attn.o_proj.weight": weight(hidden, heads * head_dim),
                      prefix + "mlp.gate_proj.weight": weight(inter, hidden),
                      prefix + "mlp.up_proj.weight": weight(inter, hidden),
                      prefix + "mlp.down_proj.weight": weight(hidden, inter),
                      prefix + "input_layernorm.weight": norm(), prefix + "post_attention_layernorm.weight": norm()})
        if sum(t.numel() for t in shard.values()) > 2_000_000_000 or layer == layers - 1:
            name = f"model-{len(files):05d}.safetensors"
            save_file(shard, path / name, metadata={"format": "pt"})
            index.update({key: name for key in shard})
            files.append(name)
            shard = {}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))


def make(out: Path, spec: str, keep_safetensors: bool, force: bool) -> Path:
    from toolkit.core.convert import convert  # noqa: PLC0415

    size, qtype = spec.split(":")
    dest = out / f"llama-{size}-{qtype}.gguf"
    if dest.exists() and not force:
        print(f"{dest}: exists", flush=True)
        return dest
    source = out / f"{size}-bf16"
    if not (source / "config.json").exists():
        start = time.perf_counter()
        write_checkpoint(source, size)
        print(f"{source}: random checkpoint in {time.perf_counter() - start:.1f}s", flush=True)
    start = time.perf_counter()
    convert(source, dest, to=f"gguf:{qtype}", force=True)
    print(f"{dest}: {dest.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - start:.1f}s", flush=True)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="SIZE:TYPE, SIZE in "
                        + ", ".join(SHAPES))
    parser.add_argument("--keep-safetensors", action="store_true")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.models:
        make(args.out, spec, args.keep_safetensors, args.force)
    if not args.keep_safetensors:
        import shutil  # noqa: PLC0415
        for size in {spec.split(":")[0] for spec in args.models}:
            shutil.rmtree(args.out / f"{size}-bf16", ignore_errors=True)


if __name__ == "__main__":
    main()
