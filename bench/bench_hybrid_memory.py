"""How many sequences fit in a fixed cache budget on a Qwen3.5-9B-shaped model: our sizing
(paged KV for the attention layers only + one recurrent-state slot per sequence) vs sizing
every layer as attention (one uniform KV page size for all layers, as vLLM's hybrid allocator
first did).

The model is transformers' ``Qwen3_5TextConfig()`` defaults ("Qwen3.5-9B style"): 32 layers,
every 4th full attention (8 attention, 24 Gated DeltaNet), 4 KV heads x 256, linear attention
16 key / 32 value heads of 128, conv kernel 4. It is built on the meta device (no memory), and
the byte sizes come from the engine's own ModelRunner (the numbers ``LLM.memory_report()``
prints). Pure arithmetic: runs on CPU in a second.

    python bench/bench_hybrid_memory.py [--budget-gib 16] [--dtype bf16] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import torch
import transformers as tf

from toolkit.core.config import parse_dtype
from toolkit.core.engine.model_runner import ModelRunner, RunnerConfig
from toolkit.core.parallel import SINGLE
from toolkit.core.registry import default_registry

CONTEXTS = (4096, 32768, 131072)


def build_meta_model(dtype: torch.dtype):
    registry = default_registry()
    hf = tf.Qwen3_5TextConfig().to_dict() | {"architectures": ["Qwen3_5ForCausalLM"]}
    arch = registry.architecture("Qwen3_5ForCausalLM")
    config = arch.config_from(hf)
    scheme = registry.quant_scheme("unquantized").from_spec("unquantized", params_dtype=dtype)
    with torch.device("meta"):
        model = arch.build(config, scheme, SINGLE)
    return SimpleNamespace(model=model, device="cpu", scheme=scheme), config


def capacity(per_token: int, per_slot: int, budget: int, context: int) -> int:
    """Most sequences of ``context`` tokens whose KV and state (plus the null slot) fit in ``budget``."""
    return max(0, (budget - per_slot) // (context * per_token + per_slot))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--json")
    args = parser.parse_args()
    dtype, budget = parse_dtype(args.dtype), int(args.budget_gib * 2**30)
    loaded, config = build_meta_model(dtype)
    rows = []
    for context in CONTEXTS:
        runner = ModelRunner(loaded, RunnerConfig(block_size=16, max_num_seqs=4096, max_num_batched_tokens=8192,
                                                  max_model_len=context, kv_cache_memory=budget))
        per_token, per_slot = runner.block_bytes // 16, runner.slot_bytes
        ours = capacity(per_token, per_slot, budget, context)
        # cross-check with the runner's own split for that many sequences
        check = ModelRunner(loaded, RunnerConfig(block_size=16, max_num_seqs=max(ours, 1), max_num_batched_tokens=8192,
                                                 max_model_len=context, kv_cache_memory=budget))
        blocks, slots = check.profile_num_blocks()
        assert slots == max(ours, 1) and blocks * 16 >= ours * context, (blocks, slots)
        all_attention = budget // (context * per_token * config.num_layers // len(runner.layers))
        rows.append({"context": context, "kv_bytes_per_token": per_token, "state_bytes_per_slot": per_slot,
                     "seqs_ours": ours, "seqs_all_layers_as_attention": all_attention,
                     "ratio": ours / max(all_attention, 1)})
    print(f"Qwen3.5-9B-shaped ({len(runner.layers)} attention + {len(runner.states)} Gated DeltaNet layers), "
          f"{args.dtype}, budget {args.budget_gib:g} GiB")
    print(f"{'context':>8} {'KV B/token':>11} {'state B/seq':>12} {'seqs (ours)':>12} {'seqs (all-attn)':>16} "
          f"{'ratio':>6}")
    for r in rows:
        print(f"{r['context']:>8} {r['kv_bytes_per_token']:>11} {r['state_bytes_per_slot']:>12} {r['seqs_ours']:>12} "
              f"{r['seqs_all_layers_as_attention']:>16} {r['ratio']:>6.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"budget_bytes": budget, "dtype": args.dtype, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
