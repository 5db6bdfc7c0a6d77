"""Write a synthetic Qwen3-MoE GGUF with random weights (default: Qwen3-30B-A3B's shapes, Q4_K_M).

For speed comparisons where the real checkpoint cannot be downloaded: the file has the tensor
names, shapes, types and metadata llama.cpp's converter + ``llama-quantize Q4_K_M`` produce for
Qwen3-30B-A3B (48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts of 768, top-8,
vocab 151936), so llama.cpp and toolkit both load it and run exactly the work the real model
needs. The values are random but valid: packed bytes are random, with every block's scale fields
set to small finite values (no NaN/inf anywhere), routers and norms in F32. Token ids are all
that a benchmark feeds it; the vocabulary is placeholder byte-level BPE tokens.

Types follow toolkit's Q4_K_M recipe (recipes.py, llama.cpp's ``llama_tensor_get_type``): Q4_K,
with attn_v / ffn_down_exps at Q6_K on the ``use_more_bits`` layers, the output head Q6_K.

Bytes are generated and written one tensor at a time (peak memory: one tensor), on the GPU when
there is one. Usage (about 17 GiB for the full shape; ~1-3 minutes):

    python bench/make_moe_gguf.py /tmp/qwen3-30b-a3b-synthetic-Q4_K_M.gguf
    python bench/make_moe_gguf.py /tmp/tiny.gguf --layers 2 --experts 8 --vocab 1024   # a quick check
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

from toolkit.plugins.loaders.gguf.recipes import TypePlan

Q = GGMLQuantizationType
# byte offsets of each block's float16 scale fields, per type (ggml's block layouts)
SCALE_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q5_0: (0,)}
SCALE = {Q.Q4_K: 2e-5, Q.Q5_K: 1e-5, Q.Q6_K: 5e-5, Q.Q8_0: 2e-4, Q.Q4_0: 3e-3, Q.Q5_0: 1.5e-3}


def shapes(args) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape in torch order) of every tensor, in llama.cpp's file order."""
    h, hd, e, ff = args.hidden, args.head_dim, args.experts, args.expert_ffn
    out = [("token_embd.weight", (args.vocab, h))]
    for i in range(args.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,)), (b + "attn_q.weight", (args.heads * hd, h)),
                (b + "attn_k.weight", (args.kv_heads * hd, h)), (b + "attn_v.weight", (args.kv_heads * hd, h)),
                (b + "attn_output.weight", (h, args.heads * hd)), (b + "attn_q_norm.weight", (hd,)),
                (b + "attn_k_norm.weight", (hd,)), (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate_inp.weight", (e, h)), (b + "ffn_gate_exps.weight", (e, ff, h)),
                (b + "ffn_up_exps.weight", (e, ff, h)), (b + "ffn_down_exps.weight", (e, h, ff))]
    return out + [("output_norm.weight", (h,)), ("output.weight", (args.vocab, h))]


def packed(shape: tuple[int, ...], qtype, generator: torch.Generator, device: str) -> np.ndarray:
    """Random blocks of ``qtype`` with small finite scales, uint8 [..., row_bytes]."""
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = int(np.prod(shape)) // block
    data = torch.randint(0, 256, (blocks, size), dtype=torch.uint8, generator=generator, device=device)
    for offset in SCALE_FIELDS[qtype]:
        scales = (torch.rand(blocks, generator=generator, device=device) * 0.5 + 0.75) * SCALE[qtype]
        data[:, offset:offset + 2] = scales.to(torch.float16).view(torch.uint8).view(blocks, 2)
    return data.cpu().numpy().reshape(*shape[:-1], shape[-1] // block * size)


def values(name: str, shape: tuple[int, ...], generator: torch.Generator, device: str) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    scale = 1.0 / shape[-1] ** 0.5
    return (torch.randn(shape, generator=generator, device=device) * scale).cpu().numpy()


def add_metadata(writer: GGUFWriter, args) -> None:
    arch = "qwen3moe"
    writer.add_type("model")
    writer.add_name("synthetic-qwen3-moe")
    for key, value in {"context_length": 40960, "block_count": args.layers, "embedding_length": args.hidden,
                       "feed_forward_length": 6144, "attention.head_count": args.heads,
                       "attention.head_count_kv": args.kv_heads, "attention.key_length": args.head_dim,
                       "attention.value_length": args.head_dim, "expert_count": args.experts,
                       "expert_used_count": args.top_k, "expert_feed_forward_length": args.expert_ffn,
                       "vocab_size": args.vocab}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 1e6)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_file_type(int(LlamaFileType.MOSTLY_Q4_K_M))
    writer.add_quantization_version(2)
    add_tokenizer(writer, args.vocab)


def add_tokenizer(writer: GGUFWriter, vocab: int) -> None:
    """Placeholder byte-level BPE vocabulary: llama.cpp needs one to load the file."""
    alphabet = [chr(c) for c in range(0x21, 0x7f)] + [chr(c) for c in range(0xa1, 0xad)] + \
        [chr(c) for c in range(0xae, 0x100)]
    alphabet += [chr(0x100 + i) for i in range(256 - len(alphabet))]
    tokens = alphabet + ["\u0120\u0120"] + [f"t{i}" for i in range(vocab - len(alphabet) - 1)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(TokenType.NORMAL)] * vocab)
    writer.add_token_merges(["\u0120 \u0120"])
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    for flag, default in (("layers", 48), ("hidden", 2048), ("heads", 32), ("kv-heads", 4), ("head-dim", 128),
                          ("experts", 128), ("top-k", 8), ("expert-ffn", 768), ("vocab", 151936), ("seed", 0)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(args.seed)
    plan = TypePlan("Q4_K_M", (), num_layers=args.layers, tied=False)
    start = time.perf_counter()
    writer = GGUFWriter(str(args.dest), "qwen3moe")
    add_metadata(writer, args)
    tensors = []
    for name, shape in shapes(args):
        qtype = Q.F32 if name.endswith("ffn_gate_inp.weight") else plan.choose(name, name, shape).qtype
        block, size = GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(shape)) // block * size
        if qtype == Q.F32:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), nbytes)
        else:  # gguf-py takes a quantized tensor's shape in bytes
            writer.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.dtype(np.uint8), nbytes,
                                   raw_dtype=qtype)
        tensors.append((name, shape, qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, qtype in tensors:  # generated and written one at a time
        data = values(name, shape, generator, device) if qtype == Q.F32 else packed(shape, qtype, generator, device)
        writer.write_tensor_data(data)
    writer.close()
    size = args.dest.stat().st_size
    print(f"wrote {args.dest} ({size / 2**30:.2f} GiB, {len(tensors)} tensors) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
