"""Gemma 3 through toolkit vs transformers' own Gemma 3 (fp32), on tiny random checkpoints.

Every case has sliding layers with a window of 4, so a 13-token prompt and 16 generated
tokens run far past it; global layers use linear rope scaling. All parameters, norms
included (transformers initialises those to zero), are re-drawn before saving. The
transformers reference is re-read from the saved directory, so both sides interpret the
very same config.json and weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf

import toolkit
from toolkit.core.errors import CheckpointError
from toolkit.plugins.models.gemma3 import FULL, SLIDING, config_from

VOCAB = 1001  # odd: no tensor-parallel size divides it
PROMPT, NEW_TOKENS = 13, 16
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            head_dim=16, sliding_window=4, query_pre_attn_scalar=24, rms_norm_eps=1e-6, max_position_embeddings=256)
ROPE = {FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 100_000.0},
        SLIDING: {"rope_type": "default", "rope_theta": 1_000.0}}
# transformers 4 vocabulary: no layer_types, no rope_parameters (rewritten into config.json after saving)
OLD_VOCABULARY = {"rope_theta": 100_000.0, "rope_local_base_freq": 1_000.0, "sliding_window_pattern": 2,
                  "rope_scaling": {"rope_type": "linear", "factor": 2.0}}

CASES = {
    "tied-gqa": dict(num_key_value_heads=2, rope_parameters=ROPE,
                     layer_types=[SLIDING, FULL, SLIDING, SLIDING]),
    # attn_logit_softcapping is ignored by transformers' Gemma 3 (and by us); final soft-capping applies
    "untied-mqa-softcap": dict(num_key_value_heads=1, rope_parameters=ROPE, tie_word_embeddings=False,
                               layer_types=[FULL, SLIDING, SLIDING, FULL],
                               attn_logit_softcapping=3.0, final_logit_softcapping=5.0),
    "old-config-vocabulary": dict(num_key_value_heads=2, old_vocabulary=True),
}


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Norm weights ~ N(0, 0.3) (used as 1 + w); embeddings shrunk by sqrt(hidden), which Gemma multiplies
    back, so that greedy decoding does not just repeat the last token."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            std = 0.3 if "norm" in name else 0.1 / 8 if "embed_tokens" in name else 0.1
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model


def save_gemma3(path: Path, *, old_vocabulary: bool = False, **config) -> tf.Gemma3ForCausalLM:
    """Save a random Gemma3ForCausalLM; returns transformers' model re-read from ``path``."""
    torch.manual_seed(0)
    randomize(tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**{**TINY, **config}))).save_pretrained(path)
    if old_vocabulary:
        written = json.loads((path / "config.json").read_text())
        for key in ("layer_types", "rope_parameters", "_sliding_window_pattern"):
            written.pop(key, None)
        (path / "config.json").write_text(json.dumps({**written, **OLD_VOCABULARY}))
    return tf.Gemma3ForCausalLM.from_pretrained(path).eval()


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return save_gemma3(path, **CASES[request.param]), toolkit.load(path, device="cpu"), path


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, ids: torch.Tensor) -> list[int]:
    out = model.generate(ids[None], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         pad_token_id=0)
    return out[0, ids.shape[0]:].tolist()


def test_logits_match_transformers(pair):
    reference, loaded, _ = pair
    ids = prompt()
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    got = loaded.logits(ids)
    assert got.shape == expected.shape == (PROMPT, VOCAB)
    assert (got - expected).abs().max().item() <= 1e-4


def test_greedy_generation_matches_transformers(pair):
    """Prefill then one token at a time through the paged KV cache, well past the window."""
    reference, loaded, _ = pair
    ids = prompt(seed=2)
    expected = hf_greedy(reference, ids)
    assert len(set(expected)) > NEW_TOKENS // 2  # a non-degenerate continuation, or the check is weak
    assert loaded.generate(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=[]) == expected


def test_layer_types_and_rope_reach_the_layers(pair):
    reference, loaded, _ = pair
    layer_types = reference.config.layer_types
    assert FULL in layer_types and SLIDING in layer_types
    for layer, kind in zip(loaded.model.model.layers, layer_types):
        attention = layer.self_attn
        hf_rope = reference.model.rotary_emb
        assert attention.attn.sliding_window == (4 if kind == SLIDING else None)
        torch.testing.assert_close(attention.rotary.inv_freq, getattr(hf_rope, f"{kind}_inv_freq"), rtol=0, atol=0)


def test_cases_exercise_window_and_rope_scaling(tmp_path):
    """Guard on the test itself: without the window or the scaling, transformers' logits change."""
    ids = prompt()
    with torch.no_grad():
        base = save_gemma3(tmp_path / "a", **CASES["tied-gqa"])(ids[None]).logits
        wide = save_gemma3(tmp_path / "b", **{**CASES["tied-gqa"], "sliding_window": 64})(ids[None]).logits
        rope = {FULL: {"rope_type": "default", "rope_theta": 100_000.0}, SLIDING: ROPE[SLIDING]}
        unscaled = save_gemma3(tmp_path / "c", **{**CASES["tied-gqa"], "rope_parameters": rope})(ids[None]).logits
    assert (base - wide).abs().max() > 1e-2
    assert (base - unscaled).abs().max() > 1e-2


# ---- configs as published, interpreted like transformers does -------------------------------
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "eos_token_id": [1, 106],
             "bos_token_id": 2, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
             "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
             "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256,
             "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
             "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144}
GEMMA3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": [1, 106],
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                             "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 37,
                               "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28,
                               "patch_size": 14}}


@pytest.mark.parametrize("published", [GEMMA3_1B, GEMMA3_4B], ids=["1b-text", "4b-multimodal"])
def test_published_configs_read_like_transformers(published, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(published))
    hf = tf.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = config_from(published)
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads,
            ours.num_kv_heads, ours.head_dim) == (hf.vocab_size, hf.hidden_size, hf.intermediate_size,
                                                  hf.num_hidden_layers, hf.num_attention_heads,
                                                  hf.num_key_value_heads, hf.head_dim)
    assert ours.layer_types == tuple(hf.layer_types)
    assert (ours.sliding_window, ours.query_pre_attn_scalar, ours.hidden_act, ours.rms_norm_eps) == (
        hf.sliding_window, hf.query_pre_attn_scalar, hf.hidden_activation, hf.rms_norm_eps)
    for kind, theta, scaling in ((FULL, ours.rope_theta, ours.rope_scaling),
                                 (SLIDING, ours.rope_local_theta, ours.rope_local_scaling)):
        params = hf.rope_parameters[kind]
        assert theta == params["rope_theta"]
        assert (scaling or {}).get("rope_type", "default") == params["rope_type"]
        assert (scaling or {}).get("factor") == params.get("factor")
    assert ours.eos_token_ids == (1, 106)


@pytest.mark.parametrize("bad", [{"use_bidirectional_attention": True}, {"layer_types": [FULL] * 3},
                                 {"layer_types": ["chunked_attention"] * 26}])
def test_unsupported_configs_are_typed_errors(bad):
    with pytest.raises(CheckpointError):
        config_from({**GEMMA3_1B, **bad})


# ---- a multimodal checkpoint: its language model only --------------------------------------
def test_multimodal_checkpoint_loads_its_language_model(tmp_path):
    text = dict(TINY, num_hidden_layers=2, num_key_value_heads=1, rope_parameters=ROPE, layer_types=[SLIDING, FULL])
    vision = dict(GEMMA3_4B["vision_config"])
    config = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=1,
                             image_token_index=1000, boi_token_index=998, eoi_token_index=999)
    torch.manual_seed(0)
    randomize(tf.Gemma3ForConditionalGeneration(config)).save_pretrained(tmp_path)
    reference = tf.Gemma3ForConditionalGeneration.from_pretrained(tmp_path).eval()
    loaded = toolkit.load(tmp_path, device="cpu")
    ids = prompt()
    with torch.no_grad():
        expected = reference(input_ids=ids[None]).logits[0]
    assert (loaded.logits(ids) - expected).abs().max().item() <= 1e-4
    assert loaded.report.tensors_skipped > 0  # the vision tower and projector


# ---- tensor parallelism --------------------------------------------------------------------
def test_tp2_matches_tp1(tmp_path):
    """Two ranks over one KV head (replicated per rank), an untied head and an odd vocabulary."""
    pytest.importorskip("toolkit.core.distributed")
    save_gemma3(tmp_path, **CASES["untied-mqa-softcap"])
    single = toolkit.load(tmp_path, device="cpu")
    sharded = toolkit.load(tmp_path, tp=2, device="cpu")
    try:
        ids = prompt()
        assert (sharded.logits(ids) - single.logits(ids)).abs().max().item() <= 1e-4
        assert sharded.generate(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=[]) == \
            single.generate(ids, max_new_tokens=NEW_TOKENS, stop_token_ids=[])
    finally:
        sharded.close()
