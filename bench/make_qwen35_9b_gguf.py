"""Write a synthetic Qwen3.5-9B-shaped GGUF (random weights) with toolkit's own GGUF writer.

The shape is transformers' ``Qwen3_5TextConfig()`` defaults ("Qwen3.5-9B style": 32 layers,
every 4th full attention, hidden 4096, vocab 248320). No checkpoint is read or written: each
tensor is drawn at random (on the GPU when there is one, where the K-quant quantizer is fast)
under its Hugging Face name and streamed through ``GGUFFileWriter``, which renames and
re-lays it out as llama.cpp's converter does (qwen35: tiled value heads, ssm_a, +1 norms...) and
quantizes it with the recipe (default Q4_K_M). The file has no real tokenizer:
``tokenizer.ggml.model = "none"`` makes llama.cpp add ``qwen35.vocab_size`` dummy tokens, and
toolkit's engine takes token ids, so both can run decode benchmarks on it.

    python bench/make_qwen35_9b_gguf.py /tmp/qwen35-9b-q4_k_m.gguf [--type Q4_K_M] [--layers 32]

Values: weights ~ N(0, 0.02), norm weights ~ N(0, 0.1) (zero-centred, as stored by HF),
``A_log`` = log U(1, 16), ``dt_bias`` = 1: finite activations over a long decode.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import transformers as tf

from toolkit.plugins.loaders.gguf.writer import GGUFFileWriter


def hf_config(layers: int) -> dict:
    config = tf.Qwen3_5TextConfig()
    if layers != config.num_hidden_layers:
        config = tf.Qwen3_5TextConfig(num_hidden_layers=layers,
                                      layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                                   for i in range(layers)])
    return config.to_dict() | {"architectures": ["Qwen3_5ForCausalLM"], "torch_dtype": "bfloat16"}


def random_tensor(name: str, shape: tuple[int, ...], generator: torch.Generator, device: str) -> torch.Tensor:
    if name.endswith("A_log"):
        return torch.empty(shape, device=device).uniform_(1.0, 16.0, generator=generator).log()
    if name.endswith("dt_bias"):
        return torch.ones(shape, device=device)
    std = 0.1 if "norm" in name else 0.02
    return torch.randn(shape, generator=generator, device=device) * std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--type", default="Q4_K_M")
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    hf = hf_config(args.layers)
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in
                  tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**{k: v for k, v in hf.items()
                                                                  if k not in ("architectures", "torch_dtype")}))
                  .named_parameters()}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    start = time.perf_counter()
    writer = GGUFFileWriter(args.dest, args.type)
    writer.begin(hf_config=hf, tokenizer=None, num_tensors=len(shapes))
    writer.writer.add_string("tokenizer.ggml.model", "none")  # llama.cpp: vocab_size dummy tokens
    for name, shape in shapes.items():
        writer.add_tensor(name, random_tensor(name, shape, generator, device))
    facts = writer.finish()
    print(f"wrote {args.dest} ({args.dest.stat().st_size / 2**30:.2f} GiB, {facts['parameters'] / 1e9:.2f} B parameters, "
          f"{facts['bits_per_weight']:.2f} bits/weight, {facts['tensor_types']}) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
