"""bitsandbytes schemes on CUDA (skipped without a GPU): the same checks as on CPU, on the device.

fp32 activations on both sides, so bitsandbytes' CUDA kernels see identical packed data and
inputs; ATOL 1e-4 allows for different reduction orders of CUDA GEMMs and is still well below
the quantization's own effect on the logits (asserted).
"""
from __future__ import annotations

import pytest
import torch
import transformers as tf

import toolkit
from toolkit.plugins.loaders.bnb import BnbLoader

from test_bnb_fixtures import BNB_CONFIGS, PROMPT, SMALL, needs_accelerate, write_llama

pytestmark = [pytest.mark.gpu, needs_accelerate]
ATOL = 1e-4
SPECS = {"nf4-dq": "bnb-nf4:double_quant=true", "fp4": "bnb-fp4", "int8": "bnb-int8"}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("bnb-gpu")
    return path, write_llama(path, SMALL, seed=5)


def _hf(path, kind=None):
    config = {} if kind is None else {"quantization_config": tf.BitsAndBytesConfig(
        bnb_4bit_compute_dtype=torch.float32, **BNB_CONFIGS[kind])}
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cuda", **config).eval()
    with torch.no_grad():
        return model, model(torch.tensor([PROMPT], device="cuda")).logits[0].float()


@pytest.mark.parametrize("kind", list(SPECS))
def test_on_the_fly_matches_transformers_on_cuda(dense, kind):
    path, _ = dense
    ours = toolkit.load(path, quant=SPECS[kind], dtype="fp32", device="cuda")
    assert ours.model.model.layers[0].mlp.down_proj.weight.device.type == "cuda"
    _, reference = _hf(path, kind)
    torch.testing.assert_close(ours.logits(PROMPT), reference, rtol=0, atol=ATOL)
    assert (reference - _hf(path)[1]).abs().max() > 10 * ATOL


@pytest.mark.parametrize("kind", ["nf4-dq", "int8"])
def test_prequantized_and_round_trip_on_cuda(dense, tmp_path, kind):
    path, _ = dense
    model, reference = _hf(path, kind)
    model.save_pretrained(tmp_path / "hf")
    ours = toolkit.load(tmp_path / "hf", dtype="fp32", device="cuda")
    torch.testing.assert_close(ours.logits(PROMPT), reference, rtol=0, atol=ATOL)
    BnbLoader().save(ours, tmp_path / "ours")
    _, again = _hf(tmp_path / "ours")
    torch.testing.assert_close(again, reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("spec", ["bnb-int8", "bnb-int8:threshold=0", "bnb-nf4", "bnb-nf4:double_quant=true",
                                  "bnb-fp4"])
def test_engine_decodes_bnb_on_cuda_in_graphs_with_the_eager_tokens(dense, spec):
    """Every scheme's decode is captured in CUDA graphs (the Triton kernels of toolkit.kernels.bnb
    for up to 16 tokens; LLM.int8 with outliers included, since those kernels never search for
    outliers on the host) and gives the tokens of an engine forced to run eagerly."""
    path, _ = dense
    params = toolkit.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:3], PROMPT[:2]]
    loaded = toolkit.load(path, quant=spec, dtype="bf16", device="cuda")
    llm = toolkit.LLM(loaded, max_num_seqs=4, kv_cache_memory="64MiB")
    runner = llm.executor.runner
    assert runner.graphs is not None and runner.graph_note is None
    got = [out.token_ids for out in llm.generate(prompts, params)]
    llm.close()
    eager = toolkit.LLM(loaded, max_num_seqs=4, kv_cache_memory="64MiB", enforce_eager=True)
    assert got == [out.token_ids for out in eager.generate(prompts, params)]
    eager.close()


def test_int8_with_outliers_captures_graphs_only_up_to_the_kernels_batch(dense):
    """Decode batches of more than 16 sequences would run bitsandbytes' LLM.int8 (host sync): the
    engine captures graphs for 1..16 sequences only and runs larger steps eagerly, with the same
    tokens as an eager engine."""
    path, _ = dense
    params = toolkit.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = [PROMPT[:2 + i % 5] for i in range(18)]
    loaded = toolkit.load(path, quant="bnb-int8", dtype="bf16", device="cuda")
    llm = toolkit.LLM(loaded, max_num_seqs=20, kv_cache_memory="64MiB")
    runner = llm.executor.runner
    assert runner.graphs is not None and runner.graphs.batch_sizes[-1] == 16
    assert runner.prefill_graphs is None or runner.prefill_graphs.max_tokens <= 16
    got = [out.token_ids for out in llm.generate(prompts, params)]
    llm.close()
    eager = toolkit.LLM(loaded, max_num_seqs=20, kv_cache_memory="64MiB", enforce_eager=True)
    assert got == [out.token_ids for out in eager.generate(prompts, params)]
    eager.close()
