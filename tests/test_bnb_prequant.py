"""Checkpoints quantized and saved by transformers with BitsAndBytesConfig, loaded by toolkit.

Oracle: transformers loading the same quantized checkpoint (logits, and its own dequantized
weights for each rank's slice). On ALIGNED every tp=2 slice falls on quant blocks, so ranks
must hold exactly transformers' values; on SMALL, o_proj's rank slices cut blocks and are
re-quantized, which the load report must say.

Tolerances: tp=1 loads compute with identical packed data (ATOL 1e-6, see test_bnb_onthefly).
At tp=2 a row-parallel layer sums two partial products, which changes float32 rounding only
(ATOL_TP 1e-5, still 100x below the quantization's effect); where values legitimately change
(re-quantized slices; int8 activations quantized per rank's half of the features) the bound is
the quantization's own error: toolkit at tp=2 must stay closer to transformers' quantized
logits than those are to the full-precision model.
"""
from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit.core.config import LoadConfig
from toolkit.core.load import load_local
from toolkit.core.parallel import ParallelContext

from test_bnb_fixtures import (ALIGNED, HAS_ACCELERATE, PROMPT, SMALL, hf_bnb_model, hf_logits, hf_quantized_checkpoint,
                               our_weights, rank_weights, write_llama)

pytestmark = pytest.mark.skipif(not HAS_ACCELERATE, reason="saving with transformers' bitsandbytes needs accelerate")
ATOL, ATOL_TP = 1e-6, 1e-5


class Saved:
    """A dense checkpoint and transformers' quantized copies of it (written once per module)."""

    def __init__(self, root, sizes, seed, kinds, shard_size=None):
        self.dense_path = root / "dense"
        self.dense = write_llama(self.dense_path, sizes, seed=seed)
        self.paths, self.models = {}, {}
        for kind in kinds:
            model = hf_bnb_model(self.dense_path, kind)
            self.paths[kind] = root / kind
            model.save_pretrained(self.paths[kind], **({"max_shard_size": shard_size} if shard_size else {}))
            self.models[kind] = hf_bnb_model_reloaded(self.paths[kind])


def hf_bnb_model_reloaded(path):
    """transformers' own view of a pre-quantized checkpoint (what a user of that file gets)."""
    return hf_quantized_checkpoint(path)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    return Saved(tmp_path_factory.mktemp("bnb-pre-aligned"), ALIGNED, 3, ["nf4-dq", "fp4", "int8"],
                 shard_size="100KB")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return Saved(tmp_path_factory.mktemp("bnb-pre-small"), SMALL, 4, ["nf4"])


def _quantization_gap(saved, kind) -> float:
    return float((hf_logits(saved.models[kind]) - hf_logits(saved.dense)).abs().max())


@pytest.mark.parametrize("kind", ["nf4-dq", "fp4", "int8"])
def test_tp1_matches_transformers(aligned, kind):
    assert len(list(aligned.paths[kind].glob("*.safetensors"))) > 1  # statistics may sit in another file
    ours = toolkit.load(aligned.paths[kind], device="cpu")
    assert (ours.report.format, ours.report.scheme, ours.report.notes) == ("bnb", "bnb", [])
    torch.testing.assert_close(ours.logits(PROMPT), hf_logits(aligned.models[kind]), rtol=0, atol=ATOL)
    assert _quantization_gap(aligned, kind) > 100 * ATOL


@pytest.mark.parametrize("kind", ["nf4-dq", "int8"])
def test_tp2_ranks_hold_transformers_values_on_block_boundaries(aligned, kind):
    notes = []
    for rank in range(2):
        model, *_, report = load_local(aligned.paths[kind], LoadConfig(), parallel=ParallelContext(rank, 2))
        notes += report.notes
        for layer in range(2):
            expected = rank_weights(aligned.models[kind], layer, rank, 2)
            for name, weight in our_weights(model, layer).items():
                torch.testing.assert_close(weight, expected[name], rtol=0, atol=0, msg=f"{layer}.{name} rank {rank}")
    assert not any("re-quantized" in note for note in notes)
    if kind == "nf4-dq":  # slices that cut a nested (256-absmax) block keep float32 statistics
        assert any("double-quant statistics" in note for note in notes)


def test_tp2_requantizes_slices_that_cut_blocks_and_says_so(small):
    hf = small.models["nf4"]
    for rank in range(2):
        model, *_, report = load_local(small.paths["nf4"], LoadConfig(), parallel=ParallelContext(rank, 2))
        assert any("re-quantized" in note and "o_proj" in note for note in report.notes), report.notes
        for layer in range(2):
            expected, ours = rank_weights(hf, layer, rank, 2), our_weights(model, layer)
            for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):  # on block boundaries
                torch.testing.assert_close(ours[name], expected[name], rtol=0, atol=0)
            # re-quantizing NF4 values moves each by at most half the widest NF4 step (0.14) of its new absmax
            error = (ours["self_attn.o_proj"] - expected["self_attn.o_proj"]).abs().max()
            assert 0 < error <= 0.15 * expected["self_attn.o_proj"].abs().max()


def test_tp2_logits_on_block_boundaries(aligned):
    ours = toolkit.load(aligned.paths["nf4-dq"], device="cpu", tp=2)
    try:
        logits = ours.logits(PROMPT)
    finally:
        ours.close()
    torch.testing.assert_close(logits, hf_logits(aligned.models["nf4-dq"]), rtol=0, atol=ATOL_TP)


@pytest.mark.parametrize("which,kind", [("aligned", "int8"), ("small", "nf4")])
def test_tp2_logits_within_the_quantization_error(request, which, kind):
    saved = request.getfixturevalue(which)
    ours = toolkit.load(saved.paths[kind], device="cpu", tp=2)
    try:
        logits, notes = ours.logits(PROMPT), ours.report.notes
    finally:
        ours.close()
    error = float((logits - hf_logits(saved.models[kind])).abs().max())
    assert error < _quantization_gap(saved, kind)
    assert any("re-quantized" in note for note in notes) == (kind == "nf4")


def test_skip_modules_stay_full_precision(small, tmp_path):
    """``llm_int8_skip_modules`` (transformers' matching rule) keeps those layers unquantized, in both."""
    import transformers as tf  # noqa: PLC0415

    config = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                                   llm_int8_skip_modules=["down_proj", "lm_head"])
    tf.AutoModelForCausalLM.from_pretrained(small.dense_path, quantization_config=config, dtype=torch.float32,
                                            device_map="cpu").save_pretrained(tmp_path)
    ours = toolkit.load(tmp_path, device="cpu")
    down = ours.model.model.layers[0].mlp.down_proj.weight
    assert down.dtype == torch.float32 and ours.model.model.layers[0].mlp.gate_up_proj.weight.dtype == torch.uint8
    torch.testing.assert_close(down, small.dense.model.layers[0].mlp.down_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.logits(PROMPT), hf_logits(hf_bnb_model_reloaded(tmp_path)), rtol=0, atol=ATOL)
