"""Int8 activation blocks handed from producer to consumer (``toolkit/kernels/int8_blocks.py``): what a
norm attaches for a consumer that asks, when attached blocks are taken, and the torch rounding itself
against llama.cpp's q8_1 rule written out per element. The CUDA kernels that write and read the blocks are
checked in tests/test_int8_blocks_interpreter.py (CPU) and tests/test_fused_kernels.py (GPU)."""
from __future__ import annotations

import pytest
import torch

from toolkit.core.layers import RMSNorm
from toolkit.kernels import reference
from toolkit.kernels.int8_blocks import Int8Input, attach, attached, gated, merge, quantize_reference, requested


class Consumer:
    def __init__(self, request):
        self.request, self.asked = request, []

    def int8_input(self, tokens):
        self.asked.append(tokens)
        return self.request


def test_rounding_is_q8_1_element_by_element():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=gen) * 5
    x[1, :32] = 0.0
    words, scales, sums = quantize_reference(x, sums=True)
    q = words.view(torch.int8).reshape(3, 2, 32)
    for row in range(3):
        for block in range(2):
            values = x[row, 32 * block:32 * block + 32].tolist()
            d = max(abs(v) for v in values) / 127
            assert abs(scales[row, block].item() - d) <= 1e-6 * max(d, 1e-30)
            for i, value in enumerate(values):
                expected = 0 if d == 0 else int(value / d + (0.5 if value >= 0 else -0.5))
                near_tie = d > 0 and abs(abs(value / d) % 1 - 0.5) < 1e-4
                assert abs(q[row, block, i].item() - expected) <= (1 if near_tie else 0)
            assert abs(sums[row, block].item() - d * q[row, block].sum().item()) <= 1e-5 * (1 + abs(sums[row, block]))


def test_attached_blocks_follow_the_tensor_and_its_version():
    x = torch.randn(2, 64)
    assert attached(x, sums=False) is None
    words, scales, _ = quantize_reference(x, sums=False)
    attach(x, words, scales, None)
    assert attached(x, sums=False).words is words
    assert attached(x, sums=True) is None            # asked with sums, attached without
    assert attached(x.clone(), sums=False) is None   # another tensor
    x.mul_(2)                                        # changed in place: the blocks are stale
    assert attached(x, sums=False) is None


def test_norm_attaches_blocks_only_for_a_consumer_that_asks():
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 64))
    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    assert attached(norm(x), sums=False) is None
    consumer = Consumer(Int8Input(sums=True))
    out = norm(x, consumer)
    assert consumer.asked == [3]
    # the CPU runs the reference int8 op (a compiled CPU kernel may serve the plain norm, summing in another order)
    assert torch.equal(out, reference.rms_norm(x, norm.weight, 1e-6))
    blocks = attached(out, sums=True)
    for got, expected in zip((blocks.words, blocks.scales, blocks.sums), quantize_reference(out, sums=True)):
        assert torch.equal(got, expected)
    out, total = norm.forward_add(x, residual, consumer)
    expected_out, expected_total = reference.add_rms_norm(x, residual, norm.weight, 1e-6)
    assert torch.equal(out, expected_out) and torch.equal(total, expected_total)
    assert torch.equal(attached(out, sums=True).words, quantize_reference(out, sums=True)[0])
    declining = norm.forward_add(x, residual, Consumer(None))[0]
    assert attached(declining, sums=False) is None


def test_gated_activation_attaches_what_is_requested():
    x = torch.randn(2, 128)
    out = gated(x, "silu", Int8Input(sums=False))
    assert torch.equal(out, reference.gated_activation(x, "silu"))
    assert torch.equal(attached(out, sums=False).words, quantize_reference(out, sums=False)[0])
    assert attached(out, sums=True) is None
    assert attached(gated(x, "silu", None), sums=False) is None


def test_requests_merge_and_absent_consumers_ask_nothing():
    assert merge(None, None) is None
    assert merge(Int8Input(False), None) == Int8Input(False)
    assert merge(Int8Input(False), Int8Input(True)) == Int8Input(True)
    assert requested(None, 4) is None
    assert requested(object(), 4) is None
    assert requested(Consumer(Int8Input(False)), 4) == Int8Input(False)


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_engine_hands_blocks_on_without_changing_tokens(kind, tmp_path, runtime_with_test_kernels, monkeypatch):
    """Every producer of a GGUF model writes blocks when its consumers ask (here: asked to on a CPU, whose GGUF
    matmul reads x as it is): the engine's greedy tokens stay those of a run where nobody asks, in inference
    mode (no version counters), and the norms and gated activations attach in every layer."""
    import toolkit  # noqa: PLC0415
    from toolkit import LLM, SamplingParams  # noqa: PLC0415
    from toolkit.core.convert import convert  # noqa: PLC0415
    import toolkit.core.layers.norm as norm_module  # noqa: PLC0415
    from toolkit.kernels import int8_blocks  # noqa: PLC0415

    if kind == "llama":
        from hf_fixtures import save_hf_model  # noqa: PLC0415
        save_hf_model(tmp_path / "hf", "llama")
    else:
        from moe_fixtures import save_moe_model  # noqa: PLC0415
        save_moe_model(tmp_path / "hf", kind, mlp_only_layers=[], hidden=128, expert_ffn=64, seed=5)
    convert(tmp_path / "hf", tmp_path / "m.gguf", to="gguf:Q8_0")
    prompts = [[5, 9, 13], [7] * 20, [10, 3]]
    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in LLM(toolkit.load(str(tmp_path / "m.gguf"), device="cpu"),
                                         max_num_seqs=4).generate(prompts, greedy)]
    runtime_with_test_kernels.register("gguf_int8_input", lambda data, qtype, cols, tokens: Int8Input(sums=True),
                             device="cpu", priority=100, owner="test")
    runtime_with_test_kernels.register("gguf_moe_int8_input", lambda data, qtype, cols, routes: Int8Input(sums=False),
                             device="cpu", priority=100, owner="test")
    attached_by = []
    original = int8_blocks.attach

    def counting(x, *blocks):
        attached_by.append(tuple(x.shape))
        return original(x, *blocks)

    monkeypatch.setattr(norm_module, "attach", counting)
    monkeypatch.setattr(int8_blocks, "attach", counting)
    loaded = toolkit.load(str(tmp_path / "m.gguf"), device="cpu")
    got = [o.token_ids for o in LLM(loaded, max_num_seqs=4).generate(prompts, greedy)]
    assert got == expected
    layers = len(loaded.model.model.layers)
    assert len(attached_by) >= 2 * layers * 2        # two norms per layer, prefill and decode steps at least
