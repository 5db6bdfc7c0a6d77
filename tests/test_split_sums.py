"""Split-K partial sums handed to the next op (``toolkit/kernels/split_sums.py``).

- The wiring, on the CPU: a tiny random Llama whose linear layers return their results as three float32 partial
  sums wherever a caller asks (``apply_unreduced``) gives the same logits as transformers' own forward, and its
  o/gate-up/down projections were asked (so the norm and activation ops really added the partials). Oracle:
  transformers' modeling code.
- With a KV cache (the engine), q/k/v handed on as partials too, one of them as ``Columns`` (a weight of two quant
  types): greedy tokens equal transformers', and the rotary op that stores k and v received the partials.
- ``split_columns`` cuts partials and column pieces as ``Tensor.split`` cuts their totals.
- The consumer ops' references (``add_rms_norm_splits``, ``gated_activation_splits``) are the plain ops of the
  summed input. tests/test_split_sums_interpreter.py checks the Triton kernels, bit for bit against the two-launch
  path (the separate sum, then the plain kernel).
"""
from __future__ import annotations

import pytest
import torch

import toolkit
from hf_fixtures import VOCAB, save_hf_model
from test_engine import hf_greedy, random_prompts
from toolkit import LLM, SamplingParams
from toolkit.kernels import reference, runtime
from toolkit.kernels.split_sums import Columns, SplitSums, as_parts, reduced, split_columns


def _thirds(x: torch.Tensor, weight: torch.Tensor) -> SplitSums:
    """``x @ weight.T`` as three float32 partial sums over slices of K (uneven when K is not a multiple of 3)."""
    cuts = torch.tensor_split(torch.arange(x.shape[-1]), 3)
    parts = torch.stack([x[:, idx].float() @ weight[:, idx].float().T for idx in cuts])
    return SplitSums(parts, x.dtype)


def test_llama_layers_hand_on_split_sums(tmp_path):
    expected_model = save_hf_model(tmp_path, kind="llama")
    loaded = toolkit.load(tmp_path, device="cpu")
    scheme = loaded.scheme
    asked = []

    def apply_unreduced(layer, x):
        asked.append(layer.prefix)
        return _thirds(x, layer.weight)

    scheme.apply_unreduced = apply_unreduced             # the instance attribute the linear layers look for
    ids = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(3))
    try:
        got = loaded.logits(ids)
    finally:
        del scheme.apply_unreduced
    with torch.no_grad():
        expected = expected_model(ids[None]).logits[0]
    assert (got - expected).abs().max().item() <= 1e-4
    layers = expected_model.config.num_hidden_layers
    assert sorted(asked) == sorted(f"model.layers.{i}.{name}" for i in range(layers) for name in
                                   ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"))


def test_engine_hands_qkv_partials_to_the_rotary_store(tiny_llama, monkeypatch):
    loaded = toolkit.load(tiny_llama.path, device="cpu")
    scheme = loaded.scheme

    def apply_unreduced(layer, x):
        if not layer.prefix.endswith("qkv_proj"):
            return _thirds(x, layer.weight)
        # as a GGUF weight whose v rows have another quant type: q and k split-K partials, v a plain tensor
        qk = sum(layer.output_partition_sizes[:2])
        return Columns((_thirds(x, layer.weight[:qk]), (x.float() @ layer.weight[qk:].float().T).to(x.dtype)))

    seen = []
    call = runtime.call

    def spy(name, *args):
        if name == "rotary_store_kv_splits":
            seen.append(tuple(parts.shape[0] for parts in args[1:4]))
        return call(name, *args)

    monkeypatch.setattr(runtime, "call", spy)
    scheme.apply_unreduced = apply_unreduced
    prompts = random_prompts([3, 17, 9])
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    try:
        got = [out.token_ids for out in LLM(loaded, max_num_seqs=4).generate(prompts, greedy)]
    finally:
        del scheme.apply_unreduced
    assert got == [hf_greedy(tiny_llama.reference, prompt, 6) for prompt in prompts]
    assert seen and set(seen) == {(3, 3, 1)}      # q and k as three partials, v as itself


def test_split_columns_cuts_as_the_totals_split():
    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(4, 30, generator=gen), torch.randn(24, 30, generator=gen)
    lazy = Columns((_thirds(x, weight[:14]), x @ weight[14:].T))
    whole = reduced(lazy)
    torch.testing.assert_close(whole, x @ weight.T, rtol=1e-5, atol=1e-5)
    for sizes in ([8, 6, 10], [14, 10], [10, 8, 6]):      # the last: a cut across the two pieces
        pieces = split_columns(lazy, sizes)
        assert [tuple(piece.shape) for piece in pieces] == [(4, size) for size in sizes]
        for piece, expected in zip(pieces, whole.split(sizes, dim=-1)):
            assert torch.equal(reduced(piece), expected)
    q, k, v = split_columns(lazy, [8, 6, 10])
    assert isinstance(q, SplitSums) and isinstance(k, SplitSums) and isinstance(v, torch.Tensor)
    assert as_parts(q).shape == (3, 4, 8) and as_parts(v).shape == (1, 4, 10)
    assert [isinstance(piece, torch.Tensor) for piece in split_columns(lazy, [10, 8, 6])] == [False, True, True]


def test_linear_layers_return_tensors_unless_asked(tmp_path):
    save_hf_model(tmp_path, kind="llama")
    loaded = toolkit.load(tmp_path, device="cpu")
    loaded.scheme.apply_unreduced = lambda layer, x: _thirds(x, layer.weight)
    try:
        layer = loaded.model.model.layers[0].mlp.down_proj
        x = torch.randn(3, layer.input_size)
        assert isinstance(layer(x), torch.Tensor)
        split = layer(x, unreduced=True)
        assert isinstance(split, SplitSums) and split.shape == (3, layer.output_size)
        torch.testing.assert_close(reduced(split), layer(x), rtol=1e-5, atol=1e-5)
    finally:
        del loaded.scheme.apply_unreduced


@pytest.mark.parametrize("sums", [None, False, True])
def test_reference_ops_add_the_partials_first(sums):
    gen = torch.Generator().manual_seed(5)
    parts = torch.randn(4, 3, 64, generator=gen)
    residual = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    weight = (torch.rand(64, generator=gen) + 0.5).to(torch.bfloat16)
    total = parts[0] + parts[1] + parts[2] + parts[3]                    # split order, float32
    x = total.to(torch.bfloat16)
    out, summed, *blocks = reference.add_rms_norm_splits(parts, residual, weight, 1e-6, 0.0, sums)
    plain = (reference.add_rms_norm(x, residual, weight, 1e-6, 0.0) if sums is None
             else reference.add_rms_norm_int8(x, residual, weight, 1e-6, 0.0, sums))
    assert torch.equal(out, plain[0]) and torch.equal(summed, plain[1])
    if sums is None:
        assert blocks == [None, None, None]
    else:
        assert all(torch.equal(a, b) for a, b in zip(blocks, plain[2:]) if a is not None)
    gate_up = torch.randn(4, 3, 128, generator=gen)
    out, *blocks = reference.gated_activation_splits(gate_up, torch.bfloat16, "silu", sums)
    x = (gate_up[0] + gate_up[1] + gate_up[2] + gate_up[3]).to(torch.bfloat16)
    assert torch.equal(out, reference.gated_activation(x, "silu"))
