"""Time the Triton fused MoE at Qwen3-30B-A3B's layer shape (Q4_K gate/up, Q6_K down, top-8 of 128 experts), in CUDA graphs.

Usage (on a CUDA device): python bench/bench_moe_kernels.py
"""
import torch
from gguf import GGMLQuantizationType as Q
from toolkit.kernels import runtime
from toolkit.kernels.gguf_quant import quantize

E, H, I, K = 128, 2048, 768, 8
g = torch.Generator(device="cuda").manual_seed(0)
gu = quantize(torch.randn(E * 2 * I, H, device="cuda", generator=g) * 0.02, Q.Q4_K)
dn = quantize(torch.randn(E * H, I, device="cuda", generator=g) * 0.02, Q.Q6_K)
for T in (1, 8, 32, 512):
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    w, ids = runtime.call("moe_route", torch.randn(T, E, device="cuda"), K, True)
    args = (x, gu, int(Q.Q4_K), dn, int(Q.Q6_K), w, ids)
    fn = runtime.resolve("gguf_fused_moe", *args)
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record(); torch.cuda.synchronize()
    ms = start.elapsed_time(end) / 20
    bytes_read = min(E, T * K) * (gu.shape[0] // E * gu.shape[1] + dn.shape[0] // E * dn.shape[1])
    print(f"T={T:4d} triton fused MoE (CUDA graph) {ms:.3f} ms  ~{bytes_read / ms / 1e6:.0f} GB/s of expert bytes")
