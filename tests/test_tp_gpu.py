"""Tensor parallelism on two GPUs (NCCL): tp=2 gives tp=1's results for every kind of parameter.

The CPU tests (gloo) check the sharding logic; these check the same on CUDA devices, where each
worker owns one GPU and the collectives go through NCCL: dense safetensors weights, packed GGUF
(a Q4_K_M-style mix, through the Triton kernels in bf16 and the torch reference in fp32),
pre-quantized bitsandbytes NF4, and the batching engine over a tensor-parallel handle.
Skipped with fewer than two GPUs.
"""
from __future__ import annotations

import pytest
import torch

import toolkit
from gguf_fixtures import write_model
from test_bnb_fixtures import ALIGNED, BNB_CONFIGS, needs_accelerate, write_llama
from test_gguf_tp import MODELS as GGUF_MODELS
from toolkit import LLM, SamplingParams
from toolkit.core.engine.executor import rank_graph_sizes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]
PROMPT = [1, 5, 7, 9, 100, 3, 44, 12, 250, 2, 77]  # inside every test model's vocabulary
# fp32 on CUDA: tp=2 only changes the order of partial sums (and cuBLAS may pick other kernels for
# the half-size shapes); a wrong shard is off by the size of the logits themselves
FP32_RELATIVE = 1e-4


def _devices(loaded) -> tuple[int, str]:
    """(rank, device of its first layer's down_proj weight): runs in each worker."""
    weight = loaded.model.model.layers[0].mlp.down_proj.weight
    return loaded.parallel.tp_rank, str(weight.device)


def _gguf_kernel(loaded) -> str:
    """The module whose gguf_matmul runs for a bf16 CUDA activation in this worker."""
    from toolkit.kernels import runtime  # noqa: PLC0415

    x = torch.zeros(1, 256, dtype=torch.bfloat16, device=loaded.device)
    data = torch.zeros(1, 144, dtype=torch.uint8, device=loaded.device)  # one Q4_K row
    return runtime.resolve("gguf_matmul", x, data, 12, 256).__module__


def _logits(path, tp: int, **load_args):
    """(logits on the CPU, per-rank (rank, device) and gguf_matmul module at tp > 1)."""
    if tp == 1:
        return toolkit.load(path, device="cuda", **load_args).logits(PROMPT).cpu(), None, None
    with toolkit.load(path, device="cuda", tp=tp, **load_args) as parallel:
        got = parallel.logits(PROMPT)
        devices = parallel.run_all(_devices)
        kernels = parallel.run_all(_gguf_kernel)
    assert devices == [(0, "cuda:0"), (1, "cuda:1")]
    return got, devices, kernels


def _assert_close(got, expected, relative):
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() <= relative * scale


def _rms(a, b) -> float:
    return (a.float() - b.float()).pow(2).mean().sqrt().item()


def test_dense_tp2_matches_tp1(tiny_llama):
    _assert_close(_logits(tiny_llama.path, 2, dtype="fp32")[0], _logits(tiny_llama.path, 1, dtype="fp32")[0],
                  FP32_RELATIVE)


@pytest.mark.parametrize("name", list(GGUF_MODELS))
def test_gguf_tp2_matches_tp1(name, tmp_path):
    path = str(write_model(tmp_path / f"{name}.gguf", GGUF_MODELS[name]))
    truth = _logits(path, 1, dtype="fp32")[0]
    _assert_close(_logits(path, 2, dtype="fp32")[0], truth, FP32_RELATIVE)
    # bf16 runs the Triton kernels; each rank rounds its partial sums to bf16 before the all-reduce,
    # so tp=2 may differ from tp=1 by bf16 noise, but must not be further from the fp32 truth
    bf16_tp2, _, kernels = _logits(path, 2, dtype="bf16")
    bf16_tp1 = _logits(path, 1, dtype="bf16")[0]
    assert kernels == ["toolkit.kernels.gguf.triton_ops"] * 2
    assert _rms(bf16_tp2, truth) <= 2 * _rms(bf16_tp1, truth) < 0.05 * truth.abs().max().item()


@needs_accelerate
def test_prequantized_nf4_tp2_matches_tp1(tmp_path):
    import transformers as tf  # noqa: PLC0415

    write_llama(tmp_path / "dense", ALIGNED, seed=4)
    config = tf.BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.float32, **BNB_CONFIGS["nf4-dq"])
    model = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=config,
                                                    dtype=torch.float32, device_map="cuda")
    model.save_pretrained(tmp_path / "nf4")
    del model
    # ALIGNED: no tp=2 slice cuts a quantization block, so both hold the same NF4 values
    _assert_close(_logits(tmp_path / "nf4", 2, dtype="fp32")[0], _logits(tmp_path / "nf4", 1, dtype="fp32")[0],
                  FP32_RELATIVE)


def test_engine_tp2_matches_tp1(tiny_llama):
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (4, 19, 33)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    single = LLM(tiny_llama.path, device="cuda", dtype="fp32", gpu_memory_utilization=0.2)
    expected = [out.token_ids for out in single.generate(prompts, params)]
    del single
    with LLM(tiny_llama.path, device="cuda", dtype="fp32", tp=2, gpu_memory_utilization=0.2) as parallel:
        got = [out.token_ids for out in parallel.generate(prompts, params)]
        executor = parallel.executor
        graph_sizes = executor.handle.run_all(rank_graph_sizes, executor.engine_id)
    assert got == expected
    # decode ran from CUDA graphs on both ranks, the NCCL all-reduces captured inside them
    assert graph_sizes[0] == graph_sizes[1] and 1 in graph_sizes[0]
