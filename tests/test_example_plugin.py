"""The third-party example plugin (examples/toolkit-example-plugin), once pip-installed.

It must be found through its own distribution's entry point, and a model stored as .npz must
load through it with the same logits as transformers and as the safetensors path.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution

import numpy as np
import pytest
import torch

import toolkit
from toolkit.core.errors import UnsafeCheckpointError

try:
    distribution("toolkit-example-plugin")
except PackageNotFoundError:
    pytest.skip("toolkit-example-plugin is not installed (pip install -e examples/toolkit-example-plugin)",
                allow_module_level=True)

IDS = torch.tensor([1, 17, 400, 510, 3, 250, 42, 7, 300, 12])


def _write_npz_dir(src, dest, state_dict):
    """An npz checkpoint written with numpy alone (independent of the plugin's writer)."""
    dest.mkdir()
    shutil.copy(src / "config.json", dest / "config.json")
    np.savez(dest / "model.npz", **{name: t.detach().numpy() for name, t in state_dict.items()})


@pytest.fixture(scope="module")
def npz_dir(tiny_llama, tmp_path_factory):
    dest = tmp_path_factory.mktemp("npz") / "tiny-llama-npz"
    _write_npz_dir(tiny_llama.path, dest, tiny_llama.reference.state_dict())
    return dest


def test_plugins_lists_the_distribution():
    out = subprocess.run([sys.executable, "-m", "toolkit", "plugins", "--json"], capture_output=True, text=True,
                         check=True).stdout
    rows = {row["name"]: row for row in json.loads(out)}
    row = rows["example-npz"]
    assert row["error"] is None
    assert row["builtin"] is False and row["origin"] == "distribution toolkit-example-plugin"
    assert row["registers"] == {"loader": ["npz"], "name map": ["npz:*"]}


def test_npz_logits_match_transformers_and_safetensors(tiny_llama, npz_dir):
    loaded = toolkit.load(npz_dir, device="cpu")
    assert loaded.report.format == "npz"
    with torch.no_grad():
        expected = tiny_llama.reference(IDS[None]).logits[0]
    got = loaded.logits(IDS)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert torch.equal(got, toolkit.load(tiny_llama.path, device="cpu").logits(IDS))


def test_detected_over_safetensors_and_forced_by_format(npz_dir):
    registry = toolkit.core.registry.default_registry()
    from toolkit.core.source import resolve

    assert registry.loaders["npz"].detect(resolve(npz_dir)) is not None
    assert registry.loaders["safetensors"].detect(resolve(npz_dir)) is None
    assert registry.loaders["npz"].detect(resolve(npz_dir / "config.json")) is None  # a file must be an archive
    assert toolkit.load(npz_dir / "model.npz", format="npz", device="cpu").report.format == "npz"


def test_convert_writes_npz_through_the_plugin(tiny_llama, tmp_path):
    from toolkit.core.convert import convert

    dest = tmp_path / "converted"
    convert(tiny_llama.path, dest, to="npz")
    with np.load(dest / "model.npz", allow_pickle=False) as archive:  # numpy reads what the plugin wrote
        for name, tensor in tiny_llama.reference.state_dict().items():
            if name in archive.files:
                assert np.array_equal(archive[name], tensor.numpy()), name
    loaded = toolkit.load(dest, device="cpu")
    with torch.no_grad():
        expected = tiny_llama.reference(IDS[None]).logits[0]
    torch.testing.assert_close(loaded.logits(IDS), expected, atol=1e-4, rtol=0)
    assert loaded.tokenizer is not None and loaded.tokenizer.encode("Paris") == \
        toolkit.load(tiny_llama.path, device="cpu").tokenizer.encode("Paris")


def test_inspect_reads_headers_only(npz_dir, tiny_llama, capsys):
    from toolkit.core.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(npz_dir), "--json"])
    assert not exit_info.value.code
    data = json.loads(capsys.readouterr().out)
    state = tiny_llama.reference.state_dict()
    assert data["format"] == "npz" and data["architecture"] == "LlamaForCausalLM"
    assert data["tensors"]["count"] == len(state)
    assert data["tensors"]["total_bytes"] == sum(t.nbytes for t in state.values())
    shapes = {row["name"]: tuple(row["shape"]) for row in data["tensors"]["rows"]}
    assert shapes == {name: tuple(t.shape) for name, t in state.items()}


def test_pickled_object_array_is_refused(tiny_llama, tmp_path):
    dest = tmp_path / "evil"
    state = dict(tiny_llama.reference.state_dict())
    dest.mkdir()
    shutil.copy(tiny_llama.path / "config.json", dest / "config.json")
    arrays = {name: t.numpy() for name, t in state.items()}
    arrays["model.norm.weight"] = np.array([{"not": "a tensor"}], dtype=object)
    np.savez(dest / "model.npz", **arrays)  # numpy pickles object arrays on save
    with pytest.raises(UnsafeCheckpointError, match="model.norm.weight") as info:
        toolkit.load(dest, device="cpu")
    assert "model.npz" in str(info.value)
