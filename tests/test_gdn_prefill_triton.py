"""The Gated DeltaNet prefill Triton kernels (``kernels/recurrent/triton_prefill.py``) run by
Triton's interpreter on the CPU, against the torch references (which test_recurrent_kernels.py
checks against transformers). Tiny shapes: the interpreter runs every program in numpy.

Skipped where Triton is not installed and on CUDA machines, where test_gdn_prefill_gpu.py
checks the compiled kernels instead. The interpreter switch is read when ``@triton.jit`` decorates,
Triton's own helpers included, so it must be set before Triton is first imported: where this
process imported Triton earlier (a run of several files), one test runs this file in a fresh
process instead. Loops with loaded bounds run under numpy >= 2.4 through
``triton_interpreter.fix_loop_bounds``.
"""
from __future__ import annotations

import pytest
import torch

from triton_interpreter import interpreted_modules, rerun_in_fresh_process, start_interpreter
from toolkit.kernels import recurrent_reference as ref

INTERPRETED = start_interpreter("test_gdn_prefill_gpu.py")
here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")
if INTERPRETED:
    (tp,) = interpreted_modules("toolkit.kernels.recurrent.triton_prefill")


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _bounds(lengths):
    return torch.tensor([0, *lengths]).cumsum(0)


@here
@pytest.mark.parametrize("with_state", [True, False])
def test_conv1d_prefill_kernel_matches_reference(with_state):
    """Varlen prompts: one longer than a token block, ones shorter than the window (their new
    window keeps old entries), an empty one, fresh and resuming slots, strided rows, a bias."""
    lengths, channels, width = [21, 1, 2, 0, 5], 40, 4
    tokens = sum(lengths)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, channels + 3, generator=g)[:, :channels]
    weight = torch.randn(channels, width, generator=g)
    bias = torch.randn(channels, generator=g)
    slots = torch.tensor([4, 0, 2, 5, 1])
    fresh = torch.tensor([False, True, False, True, False])
    state = torch.randn(6, channels, width - 1, generator=g) if with_state else None
    if with_state:
        state[slots[fresh]] = float("nan")  # fresh slots' old content is never read
    state_ref = state.clone() if with_state else None
    for b in (None, bias):
        expected = ref.causal_conv1d_prefill(x, weight, b, state_ref.clone() if with_state else None,
                                             _bounds(lengths), slots, fresh)
        got = tp.causal_conv1d_prefill(x, weight, b, state.clone() if with_state else None, _bounds(lengths),
                                       slots, fresh)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    expected = ref.causal_conv1d_prefill(x, weight, None, state_ref, _bounds(lengths), slots, fresh, activation=False)
    got = tp.causal_conv1d_prefill(x, weight, None, state, _bounds(lengths), slots, fresh, activation=False)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if with_state:
        torch.testing.assert_close(state, state_ref, atol=0, rtol=0)
        assert not torch.equal(state[2], state[2] * 0)  # a short resumed sequence kept old window entries


def _gdr_inputs(lengths, hk, hv, dk, dv, seed):
    tokens = sum(lengths)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(tokens, hk, dk, generator=g), torch.randn(tokens, hk, dk, generator=g)
    v = torch.randn(tokens, hv, dv, generator=g)
    decay = -torch.rand(tokens, hv, generator=g) * 0.3
    beta = torch.rand(tokens, hv, generator=g)
    return q, k, v, decay, beta


@here
@pytest.mark.parametrize("heads", [(1, 2, 16, 24), (2, 4, 8, 12)])
def test_chunked_gated_delta_rule_kernel_matches_reference(heads):
    """Varlen batch crossing a 64-token chunk boundary, with non-zero initial states, a fresh slot
    (old content, NaN here, ignored), grouped heads, head widths padded to powers of two >= 16."""
    hk, hv, dk, dv = heads
    lengths = [67, 1, 3]
    q, k, v, decay, beta = _gdr_inputs(lengths, hk, hv, dk, dv, seed=1)
    state = torch.randn(5, hv, dk, dv, generator=torch.Generator().manual_seed(2)) * 0.3
    state[0] = float("nan")  # the fresh sequence's slot: its old content is never read
    state_ref = state.clone()
    slots, fresh = torch.tensor([3, 0, 4]), torch.tensor([False, True, False])
    expected = ref.gated_delta_rule_prefill(q, k, v, decay, beta, state_ref, _bounds(lengths), slots, fresh)
    got = tp.gated_delta_rule_prefill(q, k, v, decay, beta, state, _bounds(lengths), slots, fresh)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(state, state_ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(state[1], state_ref[1]) and torch.equal(state[2], state_ref[2])  # untouched slots


@here
def test_chunked_gated_delta_rule_kernel_resumes_and_runs_without_state():
    """A prompt split across two calls (the second resuming from the slot the first wrote) equals the
    whole prompt in one call; with no state pool the output matches the reference's."""
    hk, hv, dk, dv = 1, 1, 16, 16
    q, k, v, decay, beta = _gdr_inputs([70], hk, hv, dk, dv, seed=3)
    whole = tp.gated_delta_rule_prefill(q, k, v, decay, beta, None, _bounds([70]), None, None)
    torch.testing.assert_close(whole, ref.gated_delta_rule_prefill(q, k, v, decay, beta, None, _bounds([70]),
                                                                    None, None), atol=2e-5, rtol=1e-4)
    state = torch.full((2, hv, dk, dv), 7.0)
    slots = torch.tensor([1])
    first = tp.gated_delta_rule_prefill(*(t[:45] for t in (q, k, v, decay, beta)), state, _bounds([45]), slots,
                                        torch.tensor([True]))
    second = tp.gated_delta_rule_prefill(*(t[45:] for t in (q, k, v, decay, beta)), state, _bounds([25]), slots,
                                         torch.tensor([False]))
    torch.testing.assert_close(torch.cat((first, second)), whole, atol=2e-5, rtol=1e-4)
    assert (state[0] == 7.0).all()


@here
def test_layer_prefill_through_the_kernels_matches_references(runtime_with_test_kernels):
    """A Gated DeltaNet layer's prefill of one packed step (a fresh prompt crossing a chunk boundary,
    one continuing a chunked prefill from its slot's states, a one-token continuation) through the
    kernels (registered for CPU here) equals the same step through the torch references: outputs and
    both states."""
    from types import SimpleNamespace  # noqa: PLC0415

    from toolkit.core.layers import AttentionMetadata  # noqa: PLC0415
    from toolkit.core.parallel import ParallelContext  # noqa: PLC0415
    from toolkit.plugins.models.gated_deltanet import GatedDeltaNet  # noqa: PLC0415
    from toolkit.plugins.quant.unquantized import UnquantizedScheme  # noqa: PLC0415

    config = SimpleNamespace(hidden_size=32, rms_norm_eps=1e-6, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4)
    layer = GatedDeltaNet(config, quant=UnquantizedScheme(torch.float32), parallel=ParallelContext(0, 1), prefix="l")
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    lengths, done_before = [66, 9, 1], [0, 40, 7]
    starts = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    attn = AttentionMetadata(starts, torch.tensor(lengths) + torch.tensor(done_before), max_query_len=66,
                             max_seq_len=66, state_slots=torch.tensor([2, 0, 3]))
    hidden = torch.randn(sum(lengths), 32, generator=gen)
    shapes = layer.state.resolved_shapes(torch.float32)
    initial = {name: torch.randn((4, *shape), generator=gen) * 0.5 for name, (shape, _) in shapes.items()}

    def prefill():
        layer.state.tensors = {name: t.clone() for name, t in initial.items()}
        with torch.no_grad():
            return layer(hidden, attn), layer.state.tensors

    expected, expected_states = prefill()
    calls = []
    for name, fn in tp.OPS.items():
        def counted(*args, _fn=fn, _name=name, **kwargs):
            calls.append(_name)
            return _fn(*args, **kwargs)
        runtime_with_test_kernels.register(name, counted, device="cpu", priority=100, owner="test")
    out, states = prefill()
    assert sorted(calls) == sorted(tp.OPS)  # each kernel ran once
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    for name in initial:
        torch.testing.assert_close(states[name], expected_states[name], atol=1e-5, rtol=1e-4)
    assert not torch.equal(states["ssm"][2], initial["ssm"][2]) and torch.equal(states["ssm"][1], initial["ssm"][1])
