"""Prefill tokens/s of one Gated DeltaNet layer at Qwen3.5-9B's shape (hidden 4096, 16 key / 32 value
heads of 128, conv width 4), random weights, bf16 on CUDA.

On CUDA each line compares, in the same run, the Triton prefill kernels (causal conv1d over the
prompts + chunked gated delta rule) with the torch references (the ops the runtime would pick
without Triton): the whole layer (projections included, the same in both) and the two ops alone.
On CPU (no Triton) it compares the gated delta rule alone: the chunked torch reference against
transformers' token-by-token recurrence (``torch_recurrent_gated_delta_rule``), which chunks replace.

Workloads: packed varlen batches as the engine builds them, fresh (prompt starts) and resuming
(a chunked-prefill step continuing from slot states).

Usage:  python bench/bench_gdn_prefill.py                  # CUDA: Triton vs torch reference
        OMP_NUM_THREADS=2 python bench/bench_gdn_prefill.py --device cpu --small
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from types import SimpleNamespace

import torch

from toolkit.core.layers import AttentionMetadata
from toolkit.core.parallel import ParallelContext
from toolkit.kernels import runtime
from toolkit.plugins.models.gated_deltanet import GatedDeltaNet
from toolkit.plugins.quant.unquantized import UnquantizedScheme

PREFILL_OPS = ("causal_conv1d_prefill", "gated_delta_rule_prefill")
CONFIG = SimpleNamespace(hidden_size=4096, rms_norm_eps=1e-6, linear_num_key_heads=16, linear_num_value_heads=32,
                         linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)
SMALL = SimpleNamespace(**{**vars(CONFIG), "hidden_size": 1024, "linear_num_key_heads": 4, "linear_num_value_heads": 8})


@contextlib.contextmanager
def references_only():
    """Make every non-reference prefill implementation decline, so the runtime picks the torch ones."""
    saved = []
    for op in PREFILL_OPS:
        for impl in runtime.candidates(op, "cuda"):
            if impl.device != "any":
                saved.append((impl.fn, getattr(impl.fn, "supports", None)))
                impl.fn.supports = lambda *a, **k: False
    try:
        yield
    finally:
        for fn, supports in saved:
            fn.supports = supports


def make_layer(config, device, dtype):
    layer = GatedDeltaNet(config, quant=UnquantizedScheme(dtype), parallel=ParallelContext(0, 1), prefix="gdn")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * (0.5 if name.startswith("conv") else 0.02))
        layer.A_log.copy_(torch.rand(layer.A_log.shape, generator=gen).log())
    layer = layer.to(device)
    shapes = layer.state.resolved_shapes(dtype)
    layer.state.tensors = {name: torch.zeros((64, *shape), dtype=dt, device=device)  # slots 2i of <= 16 seqs
                           for name, (shape, dt) in shapes.items()}
    return layer


def metadata(lengths, resume, device):
    starts = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
    query = torch.tensor(lengths, dtype=torch.int32, device=device)
    seq_lens = query + (512 if resume else 0)  # resuming: 512 tokens were prefilled before
    return AttentionMetadata(starts, seq_lens, max_query_len=max(lengths), max_seq_len=int(seq_lens.max()),
                             state_slots=torch.arange(len(lengths), device=device) * 2)


def timed(fn, device, repeats):
    fn()  # warm-up (and Triton compiles)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def op_inputs(layer, hidden, attn):
    """The two prefill ops' arguments as the layer builds them."""
    sizes = layer.in_proj.output_partition_sizes
    projected = layer.in_proj(hidden)
    mixed, _, b, a = projected.split([layer.conv1d.channels, sizes[3], sizes[4], sizes[5]], dim=-1)
    tokens, dims = hidden.shape[0], layer.dims
    q, k, v = mixed.split(sizes[:3], dim=-1)
    g = -layer.A_log.float().exp() * torch.nn.functional.softplus(a.float() + layer.dt_bias)
    return (mixed, q.reshape(tokens, layer.k_heads, dims.head_k_dim), k.reshape(tokens, layer.k_heads, dims.head_k_dim),
            v.reshape(tokens, layer.v_heads, dims.head_v_dim), g, b.sigmoid())


def run_ops(layer, inputs, attn):
    mixed, q, k, v, g, beta = inputs
    conv, ssm = layer.state.get("conv"), layer.state.get("ssm")
    fresh = attn.starts_fresh()
    runtime.call("causal_conv1d_prefill", mixed, layer.conv1d.weight.squeeze(1), None, conv, attn.query_start_loc,
                 attn.state_slots, fresh)
    runtime.call("gated_delta_rule_prefill", q, k, v, g, beta, ssm, attn.query_start_loc, attn.state_slots, fresh, 64)


def run_gdr(layer, inputs, attn):
    _, q, k, v, g, beta = inputs
    runtime.call("gated_delta_rule_prefill", q, k, v, g, beta, layer.state.get("ssm"), attn.query_start_loc,
                 attn.state_slots, attn.starts_fresh(), 64)


def hf_recurrence(layer, inputs, attn):
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule  # noqa: PLC0415

    _, q, k, v, g, beta = inputs
    bounds = attn.query_start_loc.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        torch_recurrent_gated_delta_rule(q[None, start:end], k[None, start:end], v[None, start:end],
                                         g=g[None, start:end], beta=beta[None, start:end], initial_state=None,
                                         output_final_state=True, use_qk_l2norm_in_kernel=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="a 4/8-head layer (for CPU)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = SMALL if args.small else CONFIG
    layer = make_layer(config, device, dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"# {name}, {dtype}, GDN heads {config.linear_num_key_heads}/{config.linear_num_value_heads}x128, "
          f"median of {args.repeats}")
    workloads = ([[4096], [512] * 8, [1000, 37, 1, 2000, 300], [64] * 16] if device == "cuda"
                 else [[1024], [256] * 4, [300, 1, 77]])
    with torch.inference_mode():
        for lengths in workloads:
            for resume in (False, True):
                attn = metadata(lengths, resume, device)
                hidden = torch.randn(sum(lengths), config.hidden_size, device=device, dtype=dtype)
                inputs = op_inputs(layer, hidden, attn)
                tokens = sum(lengths)
                label = f"{len(lengths):2d} seqs {tokens:5d} tok {'resume' if resume else 'fresh '}"
                if device == "cuda":
                    fast_layer = timed(lambda: layer(hidden, attn), device, args.repeats)
                    fast_ops = timed(lambda: run_ops(layer, inputs, attn), device, args.repeats)
                    with references_only():
                        ref_layer = timed(lambda: layer(hidden, attn), device, args.repeats)
                        ref_ops = timed(lambda: run_ops(layer, inputs, attn), device, args.repeats)
                    print(f"{label}  layer: triton {tokens / fast_layer:9.0f} tok/s  torch ref "
                          f"{tokens / ref_layer:9.0f} tok/s  x{ref_layer / fast_layer:.1f}  | "
                          f"conv+GDR ops: triton {tokens / fast_ops:9.0f}"
                          f"  torch ref {tokens / ref_ops:9.0f}  x{ref_ops / fast_ops:.1f}")
                else:
                    chunked = timed(lambda: run_gdr(layer, inputs, attn), device, args.repeats)
                    recurrent = timed(lambda: hf_recurrence(layer, inputs, attn), device, max(1, args.repeats // 3))
                    print(f"{label}  gated delta rule: chunked torch ref {tokens / chunked:8.0f} tok/s  | "
                          f"transformers' token-by-token recurrence {tokens / recurrent:8.0f} tok/s  "
                          f"x{recurrent / chunked:.1f}")


if __name__ == "__main__":
    main()
