"""Reference recurrent ops vs transformers' own torch implementations (Qwen3-Next modeling code).

Checked: the chunked gated delta rule (chunks of 64) over varlen sequences, resuming from a
state, against transformers' token-by-token recurrence; our decode step against the same; the
causal conv1d prefill and decode (with state) against transformers' causal_conv1d_fn/_update.
"""
from __future__ import annotations

import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from toolkit.kernels import runtime

HK, HV, DK, DV = 2, 4, 8, 12


def _inputs(length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(length, HK, DK, generator=g), torch.randn(length, HK, DK, generator=g)
    v = torch.randn(length, HV, DV, generator=g)
    decay = -torch.rand(length, HV, generator=g) * 0.5
    beta = torch.rand(length, HV, generator=g)
    return q, k, v, decay, beta


def _hf_recurrent(q, k, v, decay, beta, initial=None):
    out, state = hf.torch_recurrent_gated_delta_rule(q[None], k[None], v[None], g=decay[None], beta=beta[None],
                                                     initial_state=initial, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    return out[0], state


def test_chunked_prefill_over_varlen_batch_resuming_from_state_matches_recurrence():
    lengths, split = [150, 1, 70], 90  # first sequence: 90 tokens now, 60 later (resume from state)
    seqs = [_inputs(n, seed) for seed, n in enumerate(lengths)]
    state = torch.zeros(5, HV, DK, DV)
    slots = torch.tensor([3, 0, 1])

    def run(parts, fresh):
        cat = [torch.cat(items) for items in zip(*parts)]
        starts = torch.tensor([0, *[p[0].shape[0] for p in parts]]).cumsum(0)
        return runtime.reference("gated_delta_rule_prefill")(*cat, state, starts, slots, fresh, 64)

    first = [tuple(t[:split] for t in seqs[0]), seqs[1], seqs[2]]
    out1 = run(first, torch.tensor([True, True, True]))
    second = [tuple(t[split:] for t in seqs[0]), tuple(t[:0] for t in seqs[1]), tuple(t[:0] for t in seqs[2])]
    out2 = run(second, torch.tensor([False, False, False]))
    expected = [_hf_recurrent(*s) for s in seqs]
    torch.testing.assert_close(torch.cat((out1[:split], out2)), expected[0][0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out1[split:split + 1], expected[1][0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out1[split + 1:], expected[2][0], atol=2e-5, rtol=1e-4)
    for slot, (_, final) in zip(slots.tolist(), expected):
        torch.testing.assert_close(state[slot], final[0], atol=2e-5, rtol=1e-4)


def test_decode_step_matches_recurrence_and_fresh_ignores_old_state():
    q, k, v, decay, beta = _inputs(2, seed=7)
    initial = torch.randn(1, HV, DK, DV, generator=torch.Generator().manual_seed(3))
    state = torch.full((4, HV, DK, DV), 123.0)
    state[2] = initial[0]
    out = runtime.reference("gated_delta_rule_decode")(
        torch.stack([q[0], q[1]]), torch.stack([k[0], k[1]]), torch.stack([v[0], v[1]]),
        torch.stack([decay[0], decay[1]]), torch.stack([beta[0], beta[1]]), state, torch.tensor([2, 1]),
        torch.tensor([False, True]))
    exp0, st0 = _hf_recurrent(q[:1], k[:1], v[:1], decay[:1], beta[:1], initial)
    exp1, st1 = _hf_recurrent(q[1:], k[1:], v[1:], decay[1:], beta[1:])
    torch.testing.assert_close(out[0], exp0[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], exp1[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[2], st0[0])
    torch.testing.assert_close(state[1], st1[0])
    assert (state[0] == 123.0).all() and (state[3] == 123.0).all()  # other slots untouched


def test_conv1d_prefill_then_decode_match_transformers():
    channels, width, length = 10, 4, 9
    g = torch.Generator().manual_seed(0)
    x = torch.randn(length + 2, channels, generator=g)
    weight = torch.randn(channels, width, generator=g)
    expected = hf.causal_conv1d_fn(x.t()[None], weight, None, activation="silu")[0].t()
    state = torch.full((3, channels, width - 1), 9.0)
    slot, fresh = torch.tensor([1]), torch.tensor([True])
    got = runtime.reference("causal_conv1d_prefill")(x[:length], weight, None, state, torch.tensor([0, length]),
                                                     slot, fresh)
    torch.testing.assert_close(got, expected[:length])
    hf_state = x[length - width:length].t()[None].clone()  # transformers keeps the last K inputs
    for t in (length, length + 1):
        step = runtime.reference("causal_conv1d_decode")(x[t:t + 1], weight, None, state, slot, torch.tensor([False]))
        hf_step = hf.causal_conv1d_update(x[t:t + 1].t()[None], hf_state, weight, None, "silu")[0].t()
        torch.testing.assert_close(step, hf_step)
        torch.testing.assert_close(step, expected[t:t + 1])
    torch.testing.assert_close(state[1], x[length + 2 - (width - 1):length + 2].t())
    assert (state[0] == 9.0).all()


def test_chunked_prefill_matches_transformers_chunked_implementations():
    """Our chunked reference against transformers' own chunked torch implementation (Qwen3-Next's and
    Qwen3.5's copies): a prompt that is not a multiple of 64, from a non-zero initial state, grouped heads."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf35  # noqa: PLC0415

    length = 150
    q, k, v, decay, beta = _inputs(length, seed=11)
    initial = torch.randn(1, HV, DK, DV, generator=torch.Generator().manual_seed(12)) * 0.5
    state = torch.zeros(3, HV, DK, DV)
    state[2] = initial[0]
    out = runtime.reference("gated_delta_rule_prefill")(q, k, v, decay, beta, state, torch.tensor([0, length]),
                                                        torch.tensor([2]), torch.tensor([False]), 64)
    for module in (hf, hf35):
        expected, final = module.torch_chunk_gated_delta_rule(
            q[None], k[None], v[None], g=decay[None], beta=beta[None], chunk_size=64, initial_state=initial.clone(),
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out, expected[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(state[2], final[0], atol=2e-5, rtol=1e-4)
