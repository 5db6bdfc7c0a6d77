"""The batching engine against transformers ``generate`` on the same random model.

A random Llama (default ~100M parameters: hidden 768, 12 layers, 12 heads / 4 KV heads,
vocab 32000, tied embeddings) is written with ``save_pretrained``, loaded once by toolkit
(the engine) and once by transformers. Both generate ``output_len`` greedy tokens for the
same batch of ``input_len``-token random prompts (end-of-sequence ignored / suppressed) at
each batch size, after a warm-up of the same shapes. Reported: output tokens/s of each, their
ratio, the engine's TTFT/TPOT, the engine without CUDA graphs, and how many of the first 32
greedy tokens agree with transformers on average (16-bit numerics may drift apart on a
random model, whose logits are nearly tied).

    python bench/bench_engine.py --device cuda --dtype bf16 --batch-sizes 1,8,32 --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch


def make_model(path: str, args) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():  # beyond transformers' init: norms and all, so nothing is trivial
            param.normal_(0, 0.05)
    model.to(torch.bfloat16).save_pretrained(path)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], output_len: int, device: str) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=device)
    sync(device)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len,
                         min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    sync(device)
    seconds = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + output_len
    return seconds, out[:, ids.shape[1]:].tolist()


def agreement(a: list[int], b: list[int], limit: int = 32) -> int:
    """Length of the common prefix of two greedy continuations (first ``limit`` tokens)."""
    return next((i for i, (x, y) in enumerate(zip(a[:limit], b[:limit])) if x != y), min(limit, len(a), len(b)))


def bench_size(size: int, hf, llm, eager, args, generator) -> dict:
    from toolkit.core.engine import benchmark  # noqa: PLC0415

    prompts = torch.randint(3, args.vocab, (size, args.input_len), generator=generator).tolist()
    hf_generate(hf, prompts, 8, args.device)                             # warm-up, same shapes
    benchmark.measure(llm, size, args.input_len, 8, prompts=prompts)
    hf_seconds, hf_tokens = hf_generate(hf, prompts, args.output_len, args.device)
    tokens: list = []
    engine = benchmark.measure(llm, size, args.input_len, args.output_len, prompts=prompts, tokens=tokens)
    row = {"batch_size": size, "hf_tokens_per_s": size * args.output_len / hf_seconds,
           "engine_tokens_per_s": engine["output_tokens_per_s"],
           "ratio": engine["output_tokens_per_s"] * hf_seconds / (size * args.output_len),
           "engine_ttft_p50_ms": engine["ttft_p50_ms"], "engine_tpot_p50_ms": engine["tpot_p50_ms"],
           "greedy_agreement_first_32": statistics.fmean(agreement(a, b) for a, b in zip(hf_tokens, tokens))}
    if eager is not None:
        benchmark.measure(eager, size, args.input_len, 8, prompts=prompts)
        row["eager_engine_tokens_per_s"] = benchmark.measure(eager, size, args.input_len, args.output_len,
                                                             prompts=prompts)["output_tokens_per_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--no-eager", action="store_true", help="skip the engine-without-CUDA-graphs column")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import toolkit  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    sizes = [int(s) for s in args.batch_sizes.split(",")]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    with tempfile.TemporaryDirectory() as path:
        make_model(path, args)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
        start = time.perf_counter()
        llm = toolkit.LLM(path, dtype=args.dtype, device=args.device, max_num_seqs=max(sizes),
                          enable_prefix_caching=False)
        print(f"engine ready in {time.perf_counter() - start:.1f}s ({llm.stats()['num_blocks']} KV blocks)", flush=True)
        eager = None if args.no_eager or args.device == "cpu" else toolkit.LLM(
            llm.loaded, max_num_seqs=max(sizes), enable_prefix_caching=False, enforce_eager=True,
            kv_cache_memory=llm.stats()["num_blocks"] * llm.executor.runner.block_bytes)
        generator = torch.Generator().manual_seed(0)
        rows = []
        for size in sizes:
            rows.append(bench_size(size, hf, llm, eager, args, generator))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    if args.json:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "device": device, "results": rows}, handle, indent=2)


def print_table(rows: list[dict]) -> None:
    print(f"\n{'batch':>5} {'transformers tok/s':>19} {'engine tok/s':>13} {'ratio':>7} {'TPOT p50 ms':>12} "
          f"{'eager engine tok/s':>19} {'agree/32':>8}")
    for row in rows:
        print(f"{row['batch_size']:>5} {row['hf_tokens_per_s']:>19.1f} {row['engine_tokens_per_s']:>13.1f} "
              f"{row['ratio']:>7.2f} {row['engine_tpot_p50_ms']:>12.2f} {row.get('eager_engine_tokens_per_s', 0):>19.1f} "
              f"{row['greedy_agreement_first_32']:>8.1f}")


if __name__ == "__main__":
    main()
