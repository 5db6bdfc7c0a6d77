"""The conversion driver: atomic output, no silent overwrite, faithful streaming copies."""
from __future__ import annotations

import pytest
import torch

import toolkit
from hf_fixtures import save_hf_model
from toolkit.core import convert as convert_module
from toolkit.core.convert import convert, fact_lines, unpacked_name
from toolkit.core.errors import ConversionError


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src")
    save_hf_model(path, kind="qwen2", shard_size="60KB")
    return path


def test_safetensors_copy_keeps_logits(source, tmp_path):
    dest = tmp_path / "copy"
    result = convert(source, dest, to="safetensors")
    ids = torch.arange(4, 20)
    original, copied = toolkit.load(source, device="cpu"), toolkit.load(dest, device="cpu")
    assert torch.equal(original.logits(ids), copied.logits(ids))
    assert result.num_parameters == sum(p.numel() for p in original.model.parameters()) - (
        original.model.model.embed_tokens.rows_per_rank - 1001) * 64 * 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bf16_target_halves_the_size(source, tmp_path):
    full = convert(source, tmp_path / "f32", to="safetensors")
    half = convert(source, tmp_path / "bf16", to="safetensors:bf16")
    assert abs(half.dest_bytes / full.dest_bytes - 0.5) < 0.02
    assert round(half.bits_per_weight) == 16


def test_refuses_to_overwrite_without_force(source, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep.txt").write_text("precious")
    with pytest.raises(ConversionError, match="--force"):
        convert(source, dest, to="safetensors")
    assert (dest / "keep.txt").read_text() == "precious"
    convert(source, dest, to="safetensors", force=True)
    assert not (dest / "keep.txt").exists() and (dest / "config.json").exists()


def test_interrupted_conversion_leaves_nothing(source, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = convert_module.to_dense

    def fail_midway(value, name):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt  # what Ctrl-C delivers mid-conversion
        return real(value, name)

    monkeypatch.setattr(convert_module, "to_dense", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        convert(source, tmp_path / "dest", to="safetensors")
    assert list(tmp_path.iterdir()) == []


def test_unknown_target_format(source, tmp_path):
    with pytest.raises(toolkit.ToolkitError, match="no-such-format"):
        convert(source, tmp_path / "x", to="no-such-format")


def test_unpacked_name_inverts_packing():
    packed = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    assert unpacked_name("model.layers.3.self_attn.qkv_proj.bias", 2, packed) == "model.layers.3.self_attn.v_proj.bias"
    assert unpacked_name("model.layers.0.mlp.gate_up_proj.weight", 0, packed) == "model.layers.0.mlp.gate_proj.weight"
    assert unpacked_name("model.norm.weight", None, packed) == "model.norm.weight"


def test_writer_facts_are_printed_whatever_their_shape():
    lines = fact_lines({"parameters": 10, "tensor_types": {"F32": 2, "Q6_K": 1}, "fallbacks": ["a: X -> Y", "b: X -> Y"],
                        "notes": [], "tp": 2, "dtype": None})
    assert lines == ["tensor types  F32 2, Q6_K 1", "fallbacks     a: X -> Y", "fallbacks     b: X -> Y",
                     "tp            2"]


def test_long_fact_lists_are_capped_with_a_count():
    lines = fact_lines({"fallbacks": [f"t{i}: X -> Y" for i in range(91)], "dtype": torch.bfloat16})
    assert lines[:5] == [f"fallbacks     t{i}: X -> Y" for i in range(5)]
    assert lines[5:] == ["fallbacks     ... and 86 more", "dtype         bfloat16"]


def test_bits_per_weight_counts_weight_files_only(source, tmp_path):
    result = convert(source, tmp_path / "bf16", to="safetensors:bf16")
    weights = sum(p.stat().st_size for p in (tmp_path / "bf16").glob("*.safetensors"))
    assert result.weight_bytes == weights < result.dest_bytes  # config.json and friends are not weights
    assert result.bits_per_weight == pytest.approx(8 * weights / result.num_parameters)


def test_output_is_readable_by_others_like_any_file(source, tmp_path):
    """safetensors writes 0600 files; converted models get the umask's permissions like open() gives."""
    import os

    umask = os.umask(0o022)
    try:
        convert(source, tmp_path / "out", to="safetensors")
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_model_level_writer_keeps_a_16_bit_source_16_bit(source, tmp_path):
    """bf16 in, nf4 out: the unquantized embedding and norms stay bf16 instead of doubling in fp32."""
    pytest.importorskip("bitsandbytes")
    from safetensors import safe_open

    convert(source, tmp_path / "bf16", to="safetensors:bf16")
    convert(tmp_path / "bf16", tmp_path / "nf4", to="bnb:nf4")
    with safe_open(str(next((tmp_path / "nf4").glob("*.safetensors"))), framework="pt") as handle:
        embed = handle.get_slice("model.embed_tokens.weight").get_dtype()
    assert embed == "BF16"


def test_convert_command_is_quiet_in_logs_and_says_when_interrupted(source, tmp_path, monkeypatch, capsys):
    from toolkit.core import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["convert", str(source), str(tmp_path / "ok"), "--to", "safetensors"])
    assert done.value.code == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "converting" in err  # no progress-bar redraws when stderr is not a terminal

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_module, "to_dense", interrupt)
    with pytest.raises(SystemExit) as done:
        cli.main(["convert", str(source), str(tmp_path / "stopped"), "--to", "safetensors"])
    err = capsys.readouterr().err
    assert done.value.code == 130 and "error: interrupted; nothing was written" in err
    assert not (tmp_path / "stopped").exists()


def test_honour_umask_on_a_single_owner_only_file(tmp_path):
    """The demo GGUF is assembled through mkstemp (0600) and then given the umask's permissions."""
    import os
    import tempfile

    from toolkit.core.permissions import honour_umask

    handle, name = tempfile.mkstemp(dir=tmp_path)
    os.close(handle)
    umask = os.umask(0o022)
    try:
        honour_umask(name)
    finally:
        os.umask(umask)
    assert os.stat(name).st_mode & 0o777 == 0o644
