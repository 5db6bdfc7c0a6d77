"""GGUF -> GGUF re-quantization without torch (plugins/loaders/gguf/direct.py, core/convert_direct.py).

The reference is the driver (core/convert.py with the GGUF writer), which maps every tensor
through the model's names and back as torch tensors: the direct plan must write the very same
bytes (and report the same summary) for each architecture with a plain name table, and decline
what it cannot reproduce. The CLI route is checked in a subprocess to import no torch at all.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter

from test_gguf_convert import save_source
from toolkit.core.convert import ConvertOptions, convert
from toolkit.core.convert_direct import convert_direct, direct_plan
from toolkit.core.errors import ConversionError
from toolkit.kernels.gguf_quant import plain, quantize

TYPES = ["Q8_0", "Q4_K_M", "Q6_K", "Q4_0", "Q5_K_S", "F32"]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def f32_source(request, tmp_path_factory):
    """A tiny random model written as an F32 GGUF file by the driver (llama: q/k rows permuted;
    qwen2: biases and a tied head; gemma3: ``1 + w`` norms and 256-column rows)."""
    folder = tmp_path_factory.mktemp(request.param)
    save_source(folder / "hf", request.param)
    convert(folder / "hf", folder / "src.gguf", to="gguf:F32")
    return request.param, folder / "src.gguf"


def both(source: Path, to: str, tmp_path: Path, overrides=()):
    """(driver's file, direct file, driver's summary, direct summary) under the same file name."""
    (tmp_path / "driver").mkdir(parents=True)
    (tmp_path / "direct").mkdir()
    ours = convert(source, tmp_path / "driver" / "out.gguf", to=to, options=ConvertOptions(overrides=overrides))
    plan = direct_plan(source, to, overrides=overrides)
    assert plan is not None
    theirs = convert_direct(plan, tmp_path / "direct" / "out.gguf")
    return (ours.dest.read_bytes(), theirs.dest.read_bytes(), _summary(ours), _summary(theirs))


def _summary(result) -> list[str]:
    return [line for line in result.summary_lines() if not line.startswith(("wrote", "time"))]


@pytest.mark.parametrize("qtype", TYPES)
def test_direct_writes_the_drivers_bytes(f32_source, qtype, tmp_path):
    kind, source = f32_source
    driver, direct, driver_summary, direct_summary = both(source, f"gguf:{qtype}", tmp_path)
    assert direct == driver, (kind, qtype)
    assert direct_summary == driver_summary


def test_direct_follows_overrides_and_16_bit_sources(f32_source, tmp_path):
    kind, source = f32_source
    overrides = (("*.mlp.down_proj.weight", "Q8_0"), ("blk.0.attn_v.weight", "Q4_K"))
    driver, direct, *_ = both(source, "gguf:Q4_K_M", tmp_path / "a", overrides=overrides)
    assert direct == driver
    types = {t.name: t.tensor_type for t in GGUFReader(tmp_path / "a" / "direct" / "out.gguf").tensors}
    assert types["blk.1.ffn_down.weight"] == Q.Q8_0 and types["blk.0.attn_v.weight"] == Q.Q4_K
    for half in ("F16", "BF16"):
        convert(source, tmp_path / f"{half}.gguf", to=f"gguf:{half}")
        driver, direct, *_ = both(tmp_path / f"{half}.gguf", "gguf:Q6_K", tmp_path / half)
        assert direct == driver, half


def test_direct_declines_what_it_cannot_reproduce(f32_source, tmp_path):
    kind, source = f32_source
    assert direct_plan(source, "gguf") is None  # the default type depends on the model config
    assert direct_plan(source, "gguf:Q3_K_XL") is None  # the driver names the known types
    assert direct_plan(source, "gguf:Q8_0", source_format="safetensors") is None
    convert(source, tmp_path / "q8.gguf", to="gguf:Q8_0")
    assert direct_plan(tmp_path / "q8.gguf", "gguf:Q4_K_M") is None  # a quantized source: the driver dequantizes
    assert direct_plan(source, "gguf:Q2_K") is None  # a type the compiled quantizer does not encode
    assert direct_plan(tmp_path / "missing.gguf", "gguf:Q8_0") is None


def test_cli_converts_without_importing_torch(f32_source, tmp_path):
    kind, source = f32_source
    if kind != "gemma3":
        pytest.skip("one architecture is enough for the process check")
    (tmp_path / "driver").mkdir()
    (tmp_path / "cli").mkdir()
    convert(source, tmp_path / "driver" / "out.gguf", to="gguf:Q4_K_M")
    script = textwrap.dedent(f"""
        import sys
        from toolkit.core.cli import main
        try:
            main(["convert", {str(source)!r}, {str(tmp_path / "cli" / "out.gguf")!r}, "--to", "gguf:Q4_K_M"])
        except SystemExit as done:
            assert not done.code, done.code
        print("torch imported:", "torch" in sys.modules)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch imported: False" in out.stdout
    assert (tmp_path / "cli" / "out.gguf").read_bytes() == (tmp_path / "driver" / "out.gguf").read_bytes()


def test_non_finite_values_are_refused_and_nothing_is_left(f32_source, tmp_path):
    kind, source = f32_source
    broken = tmp_path / "src" / "broken.gguf"
    broken.parent.mkdir()
    broken.write_bytes(source.read_bytes())
    tensor = next(t for t in GGUFReader(broken).tensors if t.name == "blk.0.ffn_up.weight")
    with open(broken, "r+b") as handle:
        handle.seek(int(tensor.data_offset) + 4 * 7)
        handle.write(np.float32(np.nan).tobytes())
    with pytest.raises(ConversionError, match="up_proj"):
        convert_direct(direct_plan(broken, "gguf:Q8_0"), tmp_path / "out" / "m.gguf")
    assert list((tmp_path / "out").iterdir()) == []


def test_interrupted_direct_conversion_leaves_nothing(f32_source, tmp_path, monkeypatch):
    kind, source = f32_source
    real, calls = plain.quantize_rows, []

    def interrupt_midway(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(plain, "quantize_rows", interrupt_midway)
    with pytest.raises(KeyboardInterrupt):
        convert_direct(direct_plan(source, "gguf:Q8_0"), tmp_path / "out" / "m.gguf")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_plain_library_matches_the_torch_extension(qtype):
    """Same C++ and flags, built without torch: the same bytes as the torch extension (quant_cpu.cpp)."""
    values = torch.randn(48, 512, generator=torch.Generator().manual_seed(int(qtype))) * 0.05
    values[3, :256] = 0.0  # an all-zero block
    values[5, 7] = 3.0  # an outlier
    ours, finite = plain.quantize_rows(values.numpy(), int(qtype))
    assert finite
    np.testing.assert_array_equal(ours, quantize(values, qtype, compiled=True).numpy())
    values[1, 1] = float("inf")
    assert not plain.quantize_rows(values.numpy(), int(qtype))[1]


def test_runs_of_finds_sentencepiece_space_runs(tmp_path):
    from toolkit.plugins.loaders.gguf.reader import open_reader  # noqa: PLC0415

    tokens = ["a", "\u2581\u2581", "\u2581", "\u2581a\u2581", "\u2581\u2581\u2581", "", "\u2581\u2581a", "\u2581\u2581"]
    writer = GGUFWriter(tmp_path / "v.gguf", "gemma3")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    field = open_reader(tmp_path / "v.gguf").fields["tokenizer.ggml.tokens"]
    expected = [i for i, t in enumerate(tokens) if len(t) > 1 and not t.strip("\u2581")]
    assert field.runs_of("\u2581".encode()) == expected == [1, 4, 7]


def test_torch_waits_passively_when_imported_after_toolkit(tmp_path, monkeypatch):
    """``import toolkit`` no longer imports torch; the first import of a module named to the hook
    (torch, here a stand-in) still runs with OMP_WAIT_POLICY=PASSIVE, removed afterwards."""
    from toolkit.core.openmp import wait_passively_when_imported  # noqa: PLC0415

    (tmp_path / "stand_in_runtime.py").write_text("import os\nPOLICY = os.environ.get('OMP_WAIT_POLICY')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    wait_passively_when_imported("stand_in_runtime")
    import stand_in_runtime  # noqa: PLC0415

    assert stand_in_runtime.POLICY == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ
    assert not any(type(f).__name__ == "_PassiveImport" and f.name == "stand_in_runtime" for f in sys.meta_path)
    out = subprocess.run([sys.executable, "-c", "import sys, toolkit; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_without_a_compiler_the_driver_converts(f32_source, tmp_path, monkeypatch):
    """The plain library cannot be built (no compiler here): the direct plan declines with a
    warning, and the CLI's route (the driver) still converts."""
    kind, source = f32_source
    monkeypatch.setattr(plain, "_library", None)
    monkeypatch.setattr(plain, "_failure", None)
    monkeypatch.setenv("TOOLKIT_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert direct_plan(source, "gguf:Q8_0") is None
    assert "no-such-compiler" in plain.failure()
    assert direct_plan(source, "gguf:F32") is not None  # nothing to quantize: no library needed
