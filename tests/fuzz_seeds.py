"""Tiny valid checkpoints of every format the fuzzer mutates (see fuzz_mutations.py).

``build_seeds(folder)`` writes, deterministically:

* ``gguf-llama/model.gguf``: Llama, F16 weights, SentencePiece vocabulary with scores;
* ``gguf-qwen2/model.gguf``: Qwen2 (q/k/v biases), Q8_0 weights, byte-level vocabulary with merges;
* ``safetensors/``: a transformers-saved Llama (config.json + model.safetensors);
* ``index/``: the same model in two safetensors shards with ``model.safetensors.index.json``;
* ``bin/``: the same model as ``pytorch_model.bin``;
* ``bnb/``: the model quantized to NF4 and saved in transformers' pre-quantized layout;
* ``sharded/``: the model's sharded state (manifest, rank file, tokenizer files);
* ``tensorizer/``: the model's tensorizer state (when tensorizer is installed).

Returns ``{kind: path}`` for the kinds that could be built (bnb and tensorizer are optional).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

SEED_KINDS = ("gguf-llama", "gguf-qwen2", "safetensors", "index", "bin", "bnb", "sharded", "tensorizer")


def build_seeds(folder: Path) -> dict[str, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / "seeds.json"
    if manifest.exists():  # built by an earlier run
        return {kind: Path(path) for kind, path in json.loads(manifest.read_text()).items()}
    seeds: dict[str, Path] = {}
    seeds.update(_gguf_seeds(folder))
    seeds.update(_hf_seeds(folder))
    seeds.update(_state_seeds(folder, seeds["safetensors"]))
    manifest.write_text(json.dumps({kind: str(path) for kind, path in seeds.items()}))
    return seeds


def _gguf_seeds(folder: Path) -> dict[str, Path]:
    from gguf import GGMLQuantizationType as Q  # noqa: PLC0415

    from gguf_fixtures import Spec, write_model  # noqa: PLC0415

    seeds = {}
    for kind, spec in (("gguf-llama", Spec(arch="llama", qtype=Q.F16, hidden=32, ffn=64, heads=4, kv_heads=2)),
                       ("gguf-qwen2", Spec(arch="qwen2", qtype=Q.Q8_0, hidden=32, ffn=64, heads=4, kv_heads=2,
                                           tokenizer="gpt2"))):
        (folder / kind).mkdir(exist_ok=True)
        seeds[kind] = write_model(folder / kind / "model.gguf", spec)
    return seeds


def _hf_seeds(folder: Path) -> dict[str, Path]:
    from hf_fixtures import save_hf_model  # noqa: PLC0415

    small = dict(vocab=128)
    save_hf_model(folder / "safetensors", "llama", **small)
    save_hf_model(folder / "index", "llama", shard_size="60KB", **small)
    save_hf_model(folder / "bin", "llama", safe=False, **small)
    return {"safetensors": folder / "safetensors", "index": folder / "index", "bin": folder / "bin"}


def _state_seeds(folder: Path, hf_dir: Path) -> dict[str, Path]:
    import toolkit  # noqa: PLC0415
    from toolkit.core.registry import default_registry  # noqa: PLC0415

    from conftest import save_tiny_tokenizer  # noqa: PLC0415

    seeds: dict[str, Path] = {}
    with_tokenizer = folder / "hf-with-tokenizer"
    shutil.copytree(hf_dir, with_tokenizer)
    save_tiny_tokenizer(with_tokenizer, vocab_size=128)
    registry = default_registry()
    plain = toolkit.load(with_tokenizer, device="cpu")
    registry.loader("sharded").save(plain, folder / "sharded")
    seeds["sharded"] = folder / "sharded"
    try:
        registry.loader("tensorizer").save(plain, folder / "tensorizer")
        seeds["tensorizer"] = folder / "tensorizer"
    except Exception:  # noqa: BLE001 - optional dependency missing: that format is not fuzzed
        pass
    try:
        quantized = toolkit.load(hf_dir, quant="bnb-nf4", device="cpu")
        registry.loader("bnb").save(quantized, folder / "bnb")
        seeds["bnb"] = folder / "bnb"
    except Exception:  # noqa: BLE001 - bitsandbytes unavailable on this machine
        pass
    return seeds
