"""The fuzzer's mutation engine: case (seed, id) -> a damaged copy of one seed checkpoint.

``make_case(seed, case_id, seeds, workdir)`` picks a seed kind and a mutation from
``random.Random(f"{seed}:{case_id}")`` alone, so a case is reproduced exactly by its (seed, id)
(``bench/fuzz_campaign.py --replay ID`` runs one with its traceback). Mutations favour values
that are well-formed but absurd (hyperparameters, tensor tables, metadata strings, indexes,
manifests) over raw byte damage, which the format parsers already handle; both are included.
Shared by the bounded test (tests/test_hardening_fuzz.py) and the campaign under bench/.
"""
from __future__ import annotations

import json
import random
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import fuzz_gguf
from fuzz_values import absurd, break_json_file, damage_bytes, edit_json, edit_json_file, flip_bytes

# Relative weight of each seed kind (kinds whose seed could not be built are skipped).
KIND_WEIGHTS = {"gguf-llama": 16, "gguf-qwen2": 12, "safetensors": 14, "index": 12, "bin": 12, "bnb": 12,
                "sharded": 12, "tensorizer": 10}
HF_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "hidden_act",
           "eos_token_id", "bos_token_id", "architectures", "model_type", "max_position_embeddings",
           "sliding_window", "tie_word_embeddings", "torch_dtype", "attention_bias", "rope_parameters"]
HF_FOCUS = [(key,) for key in HF_KEYS] + [("architectures", 0), ("rope_scaling", "factor"),
                                          ("rope_scaling", "rope_type")]


@dataclass(frozen=True)
class Case:
    seed: int
    case_id: int
    kind: str
    mutation: str
    path: Path      # what toolkit.load is given
    folder: Path    # the case's own directory (every typed error must name a file under it)


def make_case(seed: int, case_id: int, seeds: dict[str, Path], workdir: Path) -> Case:
    rng = random.Random(f"{seed}:{case_id}")
    kinds = [kind for kind in KIND_WEIGHTS if kind in seeds]
    kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
    folder = Path(workdir) / f"case-{seed}-{case_id}"
    shutil.rmtree(folder, ignore_errors=True)
    source = Path(seeds[kind])
    if source.is_dir():
        shutil.copytree(source, folder)
        target = folder
    else:
        folder.mkdir(parents=True)
        target = folder / source.name
        shutil.copy(source, target)
    mutation = MUTATORS[kind](target, rng)
    return Case(seed, case_id, kind, mutation, target, folder)


# ---- GGUF ------------------------------------------------------------------------------------------
def mutate_gguf(path: Path, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.12:
        return damage_bytes(path, rng)
    model = fuzz_gguf.parse(path)
    if roll < 0.6:
        done = fuzz_gguf.mutate_kv(model, rng)
    elif roll < 0.85:
        done = fuzz_gguf.mutate_table(model, rng)
    else:
        done = fuzz_gguf.mutate_tensors(model, rng)
    path.write_bytes(fuzz_gguf.serialize(model))
    return done


# ---- Hugging Face directories ----------------------------------------------------------------------
def mutate_config(folder: Path, rng: random.Random) -> str:
    path = folder / "config.json"
    if rng.random() < 0.12:
        return break_json_file(path, rng)
    return edit_json_file(path, rng, HF_FOCUS)


def _safetensors_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def mutate_safetensors_tensors(path: Path, rng: random.Random) -> str:
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    tensors = load_file(path)
    name = rng.choice(sorted(tensors))
    value = tensors[name]
    roll = rng.randrange(8)
    if roll == 0:
        del tensors[name]
        done = f"drop {name}"
    elif roll == 1:
        extra = rng.choice(["model.layers.99.mlp.up_proj.weight", "model.mystery.weight", "lm_head.weight",
                            "model.layers.2.input_layernorm.weight"])
        tensors[extra] = value.clone()
        done = f"add {extra} shaped like {name}"
    elif roll == 2 and value.dim() == 2:
        tensors[name] = value[:, :-1].contiguous() if rng.random() < 0.5 else value[:-1].contiguous()
        done = f"{name}: one column/row short {tuple(tensors[name].shape)}"
    elif roll == 3:
        tensors[name] = value.reshape(-1).contiguous() if rng.random() < 0.5 else value.reshape(-1)[:1].reshape(())
        done = f"{name}: reshaped to {tuple(tensors[name].shape)}"
    elif roll == 4:
        dtype = rng.choice([torch.int32, torch.int8, torch.bool, torch.float64, torch.float16, torch.uint8])
        tensors[name] = value.to(dtype)
        done = f"{name}: dtype {dtype}"
    elif roll == 5:
        tensors[name] = torch.full_like(value, rng.choice([float("nan"), float("inf")])) \
            if value.is_floating_point() else value
        done = f"{name}: non-finite values"
    elif roll == 6:
        tensors[name] = value.unsqueeze(0).contiguous()
        done = f"{name}: extra dimension"
    else:
        return f"{path.name}: " + _edit_safetensors_header(path, rng)
    save_file(tensors, path, metadata={"format": "pt"})
    return f"{path.name}: {done}"


def _edit_safetensors_header(path: Path, rng: random.Random) -> str:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    focus = [(name, field) for name in header if name != "__metadata__" for field in ("dtype", "shape",
                                                                                      "data_offsets")]
    done = edit_json(header, rng, focus[:60])
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
    return f"header {done}"


def mutate_hf(folder: Path, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return mutate_config(folder, rng)
    files = _safetensors_files(folder)
    if roll < 0.88:
        return mutate_safetensors_tensors(rng.choice(files), rng)
    return damage_bytes(rng.choice(files), rng)


def mutate_index(folder: Path, rng: random.Random) -> str:
    index = folder / "model.safetensors.index.json"
    roll = rng.random()
    if roll < 0.45:
        content = json.loads(index.read_text())
        weight_map = content.get("weight_map", {})
        name = rng.choice(sorted(weight_map))
        choice = rng.randrange(8)
        if choice == 0:
            weight_map[name] = rng.choice(["/etc/passwd", "../config.json", "../../x.safetensors", "a/../b",
                                           "missing.safetensors", "", ".", "config.json"])
        elif choice == 1:
            weight_map[name] = rng.choice(sorted(set(weight_map.values())))  # another (or the same) shard
        elif choice == 2:
            del content["weight_map"]
        elif choice == 3:
            content["weight_map"] = rng.choice([[], "x", None, 3, {}])
        elif choice == 4:
            del weight_map[name]
        elif choice == 5:
            weight_map["model.layers.0.ghost.weight"] = weight_map[name]
        else:
            weight_map[name] = absurd(rng)
        index.write_text(json.dumps(content))
        return f"index: edit {choice} at {name}"
    if roll < 0.55:
        return break_json_file(index, rng)
    return mutate_hf(folder, rng)


def mutate_bin(folder: Path, rng: random.Random) -> str:
    path = folder / "pytorch_model.bin"
    roll = rng.random()
    if roll < 0.35:
        return mutate_config(folder, rng)
    if roll < 0.5:
        return _flip_pickle(path, rng)
    if roll < 0.58:
        return damage_bytes(path, rng)
    return _edit_state(path, rng)


def _flip_pickle(path: Path, rng: random.Random) -> str:
    """One bit flipped inside the zip's ``data.pkl`` (the container stays a valid zip)."""
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    out = path.with_suffix(".tmp")
    spot = None
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for info, data in members:
            if info.filename.endswith("data.pkl"):
                buffer = bytearray(data)
                spot = rng.randrange(len(buffer))
                buffer[spot] ^= 1 << rng.randrange(8)
                data = bytes(buffer)
            archive.writestr(info, data)
    out.replace(path)
    return f"data.pkl bit flip at {spot}"


def _edit_state(path: Path, rng: random.Random) -> str:
    import torch  # noqa: PLC0415

    state = torch.load(path, weights_only=True)
    name = rng.choice(sorted(state))
    value = state[name]
    choice = rng.randrange(9)
    if choice == 0:
        state[rng.choice([7, (1, 2), 2.5])] = state.pop(name)
    elif choice == 1:
        state[name] = value.reshape(-1)[0].clone()
    elif choice == 2:
        state[name] = value.to_sparse()
    elif choice == 3:
        state[name] = torch.quantize_per_tensor(value.float(), 0.1, 0, torch.qint8)
    elif choice == 4:
        state[name] = torch.empty(value.shape, device="meta")
    elif choice == 5:
        state[name] = value.to(rng.choice([torch.int64, torch.bool, torch.int8]))
    elif choice == 6:
        state[name] = {"nested": value}
    elif choice == 7:
        state[name] = rng.choice([None, [1, 2], "x", 3])
    else:
        del state[name]
    torch.save(state, path)
    return f"state edit {choice} at {name}"


# ---- bitsandbytes pre-quantized --------------------------------------------------------------------
def mutate_bnb(folder: Path, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.3:
        return mutate_config(folder, rng)
    if roll < 0.45:
        path = folder / "config.json"
        focus = [("quantization_config", key) for key in
                 ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "llm_int8_skip_modules", "quant_method",
                  "bnb_4bit_use_double_quant", "llm_int8_threshold")] + [("quantization_config",)]
        return edit_json_file(path, rng, focus)
    path = folder / "model.safetensors"
    if roll < 0.7:
        return _edit_quant_state(path, rng)
    if roll < 0.92:
        return mutate_safetensors_tensors(path, rng)
    return damage_bytes(path, rng)


def _edit_quant_state(path: Path, rng: random.Random) -> str:
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    tensors = load_file(path)
    states = sorted(name for name in tensors if ".quant_state." in name)
    name = rng.choice(states)
    meta = json.loads(bytes(tensors[name].tolist()).decode())
    done = edit_json(meta, rng, [("blocksize",), ("shape",), ("dtype",), ("quant_type",), ("shape", 0),
                                 ("nested_blocksize",), ("nested_offset",)])
    raw = json.dumps(meta, allow_nan=True).encode()
    tensors[name] = torch.tensor(list(raw), dtype=torch.uint8)
    save_file(tensors, path, metadata={"format": "pt"})
    return f"{name}: {done}"


# ---- stored states (sharded, tensorizer) -----------------------------------------------------------
def mutate_state(folder: Path, rng: random.Random) -> str:
    manifest = next(folder.glob("toolkit-*.json"))
    roll = rng.random()
    if roll < 0.55:
        content = json.loads(manifest.read_text())
        focus = [("tp_size",), ("ranks",), ("ranks", "0"), ("ranks", "0", "files"), ("ranks", "0", "tensors"),
                 ("ranks", "0", "files", 0), ("ranks", "0", "tensors", 0, "shape"), ("ranks", "0", "tensors", 0,
                                                                                     "dtype"),
                 ("ranks", "0", "tensors", 0, "name"), ("ranks", "0", "tensors", 0, "file"), ("tokenizer_files",),
                 ("tokenizer_files", 0), ("params_dtype",), ("quant_scheme",), ("version",), ("architecture",)]
        focus += [("hf_config", key) for key in HF_KEYS]
        done = edit_json(content, rng, focus)
        manifest.write_text(json.dumps(content, allow_nan=True))
        return f"manifest: {done}"
    if roll < 0.65:
        return break_json_file(manifest, rng)
    if roll < 0.8:
        tokenizer = folder / rng.choice(["tokenizer.json", "tokenizer_config.json"])
        if rng.random() < 0.5:
            return break_json_file(tokenizer, rng)
        return edit_json_file(tokenizer, rng)
    data_files = [p for p in folder.iterdir() if p.suffix in (".safetensors", ".tensors")]
    target = rng.choice(data_files)
    if rng.random() < 0.5:
        return f"{target.name}: " + flip_bytes(target, rng)
    return damage_bytes(target, rng)


MUTATORS: dict[str, Callable[[Path, random.Random], str]] = {
    "gguf-llama": mutate_gguf, "gguf-qwen2": mutate_gguf, "safetensors": mutate_hf, "index": mutate_index,
    "bin": mutate_bin, "bnb": mutate_bnb, "sharded": mutate_state, "tensorizer": mutate_state,
}
