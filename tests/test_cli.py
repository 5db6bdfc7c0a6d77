"""The ``toolkit`` CLI: load (summary, progress, completion), inspect, plugins, errors, help."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import toolkit
from toolkit.core import cli, cli_info, cli_load
from toolkit.core.errors import SourceError

SAFETENSORS_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """Run ``toolkit ARGS`` in-process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def hf_greedy_text(tiny_llama, prompt: str, max_new_tokens: int) -> str:
    """What transformers itself generates greedily for ``prompt`` (new text only)."""
    tokenizer = toolkit.load(tiny_llama.path, device="cpu").tokenizer
    ids = torch.tensor([tokenizer.encode(prompt)])
    out = tiny_llama.reference.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                        pad_token_id=tiny_llama.reference.config.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def safetensors_header(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_slice(name) for name in handle.keys()}


# ---- load ---------------------------------------------------------------------------------
def test_load_prints_summary_and_the_greedy_completion(tiny_llama, capsys):
    prompt = "The capital of France is"
    code, out, err = run_cli(capsys, "load", tiny_llama.path, "--device", "cpu", "--prompt", prompt,
                             "--max-tokens", 8)
    assert code == 0, err
    assert "architecture  llama" in out and "format        safetensors" in out and "scheme        unquantized" in out
    for field in ("parameters", "read ", "GB/s", "time "):
        assert field in out
    expected = hf_greedy_text(tiny_llama, prompt, 8)
    assert len(expected) >= 8  # every id decodes to real text, so this comparison has teeth
    assert f"\n{prompt}{expected}\n" in out


def test_progress_bar_counts_every_tensor(tiny_llama, capsys):
    bar = cli_load.ProgressBar(disable=False)
    toolkit.load(tiny_llama.path, device="cpu", progress=bar)
    bar.close()
    total = len(tiny_llama.reference.state_dict())  # every stored tensor is reported once
    assert bar.bar.total == total and bar.bar.n == total
    assert f"{total}/{total}" in capsys.readouterr().err


def test_default_model_of_a_loader_completes_the_default_prompt(tiny_llama, capsys, monkeypatch):
    loader = toolkit.core.registry.default_registry().loader("safetensors")
    monkeypatch.setattr(loader, "default_model", lambda: tiny_llama.path, raising=False)
    code, out, err = run_cli(capsys, "load", "--format", "safetensors", "--device", "cpu", "--max-tokens", 5)
    assert code == 0, err
    assert f"model         {tiny_llama.path} (default of loader 'safetensors')" in out
    assert f"\n{cli_load.DEFAULT_PROMPT}{hf_greedy_text(tiny_llama, cli_load.DEFAULT_PROMPT, 5)}\n" in out


@pytest.mark.parametrize("args, message", [
    (["load"], "error: no MODEL given"),
    (["load", "--format", "safetensors"], "error: loader 'safetensors' ships no default model; pass MODEL"),
    (["load", "--format", "no-such-format"], "error: no plugin provides loader 'no-such-format'; known loaders:"),
    (["load", "/no/such/model"], "error: model '/no/such/model' is neither an existing file or directory"),
    (["inspect", "/no/such/model"], "error: model '/no/such/model' is neither"),
])
def test_errors_are_one_clean_line(capsys, monkeypatch, args, message):
    monkeypatch.delenv("TOOLKIT_DEBUG", raising=False)
    code, out, err = run_cli(capsys, *args)
    assert code == 1
    assert err.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in err + out


def test_unknown_format_lists_the_known_loaders(capsys):
    _, _, err = run_cli(capsys, "load", "--format", "no-such-format")
    assert "safetensors" in err.strip().splitlines()[-1]


def test_debug_shows_the_exception(monkeypatch):
    monkeypatch.setenv("TOOLKIT_DEBUG", "1")
    with pytest.raises(SourceError, match="no MODEL given"):
        cli.main(["load"])


def test_model_without_tokenizer_cannot_complete(tiny_llama, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_llama.path / name, bare / name)
    code, _, err = run_cli(capsys, "load", bare, "--device", "cpu", "--prompt", "Hi")
    assert code == 1 and "error: this checkpoint has no tokenizer; pass --tokenizer PATH" in err
    code, out, err = run_cli(capsys, "load", bare, "--device", "cpu", "--prompt", "Hi", "--max-tokens", 3,
                             "--tokenizer", tiny_llama.path)
    assert code == 0, err
    assert f"\nHi{hf_greedy_text(tiny_llama, 'Hi', 3)}\n" in out


def test_bad_dtype_is_one_line_before_loading(tiny_llama, capsys):
    code, out, err = run_cli(capsys, "load", tiny_llama.path, "--dtype", "int3")
    assert code == 1 and err.strip() == ("error: unknown dtype 'int3'; choose one of fp32, float32, fp16, float16, half, "
                                         "bf16, bfloat16")
    assert "architecture" not in out  # refused before any load


NO_CUDA = "built without CUDA" if torch.version.cuda is None else "CUDA device"


@pytest.mark.parametrize("args, message, status", [
    (["generate", "x", "-p", "hi", "--dtype", "nonsense"], "error: unknown dtype 'nonsense'", 1),
    (["chat", "x", "--dtype", "nonsense"], "error: unknown dtype 'nonsense'", 1),
    (["bench", "x", "--dtype", "nonsense"], "error: unknown dtype 'nonsense'", 1),
    (["load", "x", "--device", "tpu"], "error: unknown device 'tpu'", 1),
    (["generate", "x", "-p", "hi", "--device", "tpu"], "error: unknown device 'tpu'", 1),
    (["load", "x", "--device", "meta"], "error: device 'meta' is not supported", 1),
    (["bench", "x", "--batch-sizes", "a,b"], "error: --batch-sizes 'a,b': give positive integers", 1),
    (["bench", "x", "--batch-sizes", "0"], "error: --batch-sizes '0': give positive integers", 1),
    (["generate", "x"], "error: give --prompt TEXT", 1),
    (["load", "--tp", "abc"], "error: Invalid value for '--tp'", 2),
    (["no-such-command"], "error: No such command 'no-such-command'", 2),
])
def test_every_cli_error_is_one_line(capsys, monkeypatch, args, message, status):
    monkeypatch.delenv("TOOLKIT_DEBUG", raising=False)
    code, out, err = run_cli(capsys, *args)
    assert code == status
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert "Traceback" not in err + out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable CUDA device")
@pytest.mark.parametrize("command", [["load", "x"], ["generate", "x", "-p", "hi"], ["bench", "x"]])
def test_cuda_without_a_gpu_is_one_line(capsys, command):
    code, _, err = run_cli(capsys, *command, "--device", "cuda")
    assert code == 1 and err.startswith("error: device 'cuda'") and NO_CUDA in err and len(err.splitlines()) == 1


def test_help_and_bare_command_exit_zero(capsys):
    assert run_cli(capsys, "generate", "--help")[0] == 0
    code, out, _ = run_cli(capsys)
    assert code == 0 and "Usage" in out


def test_rates_never_print_as_zero():
    from toolkit.core.units import format_rate

    assert [format_rate(v) for v in (0.0432, 0.3, 3.714, 64.53, 583.2)] == ["0.0432", "0.3", "3.71", "64.5", "583"]


# ---- inspect -------------------------------------------------------------------------------
def test_inspect_json_matches_the_file_header(tiny_llama, capsys):
    code, out, _ = run_cli(capsys, "inspect", tiny_llama.path, "--json")
    assert code == 0
    data = json.loads(out)
    header = safetensors_header(tiny_llama.path)
    assert data["format"] == "safetensors" and data["architecture"] == "LlamaForCausalLM"
    config = json.loads((tiny_llama.path / "config.json").read_text())
    assert data["metadata"]["hidden_size"] == 64 and data["metadata"]["architectures"] == ["LlamaForCausalLM"]
    assert data["metadata"]["rms_norm_eps"] == config["rms_norm_eps"]  # JSON values, not Python reprs
    assert data["tensors"]["count"] == len(header)
    assert data["tensors"]["dtypes"] == {"F32": len(header)}
    rows = {row["name"]: row for row in data["tensors"]["rows"]}
    assert {name: tuple(row["shape"]) for name, row in rows.items()} == \
        {name: tuple(piece.get_shape()) for name, piece in header.items()}
    expected_bytes = sum(4 * torch.Size(piece.get_shape()).numel() for piece in header.values())
    assert data["tensors"]["total_bytes"] == expected_bytes


def test_inspect_text_abridges_rows_unless_all(tiny_llama, capsys):
    names = list(safetensors_header(tiny_llama.path))
    _, out, _ = run_cli(capsys, "inspect", tiny_llama.path, "--rows", 5)
    assert f"tensors       {len(names)} (" in out and f"types: F32 {len(names)}" in out
    assert sum(name in out for name in names) == 5
    assert f"... {len(names) - 5} more (--all lists every tensor)" in out
    _, out, _ = run_cli(capsys, "inspect", tiny_llama.path, "--all")
    assert all(name in out for name in names) and "more (--all" not in out


def test_json_metadata_values_are_json():
    import numpy as np

    assert cli_info.json_value(np.float32(0.5)) == 0.5 and cli_info.json_value(np.int64(3)) == 3
    assert cli_info.json_value(list(range(100))) == {"length": 100, "first": list(range(8))}
    assert cli_info.json_value(float("nan")) == "nan" and cli_info.json_value(b"\xe2\x9c\x93") == "\u2713"


def test_short_abridges_long_sequences():
    assert cli_info.abridge(list(range(1000))) == "[1000 items: 0, 1, 2, ...]"
    assert cli_info.abridge("x" * 500).endswith("...") and len(cli_info.abridge("x" * 500)) == 100
    assert cli_info.abridge({"rope_type": "llama3"}) == "{'rope_type': 'llama3'}"


# ---- plugins --------------------------------------------------------------------------------
def test_plugins_lists_builtins_with_what_they_register(capsys):
    code, out, _ = run_cli(capsys, "plugins", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["safetensors"]["origin"] == "built-in" and rows["safetensors"]["version"] == toolkit.__version__
    assert rows["safetensors"]["registers"]["loader"] == ["safetensors"]
    assert set(rows["qwen"]["registers"]["architecture"]) == {"qwen2", "qwen3"}
    assert rows["unquantized"]["error"] is None
    _, text, _ = run_cli(capsys, "plugins")
    assert "safetensors 0.1.0  [built-in]  toolkit.plugins.loaders.safetensors" in text
    assert "    loader: safetensors" in text
    assert text.strip().splitlines()[-1].startswith(f"{len(rows)} plugins, ")


# ---- help and entry points --------------------------------------------------------------------
def test_every_command_has_help_with_an_example(capsys):
    commands = cli.command_names(cli.build_app())
    assert {"load", "inspect", "plugins"} <= set(commands)
    for name in commands:
        code, out, _ = run_cli(capsys, name, "--help")
        assert code == 0 and "Example" in out, f"toolkit {name} --help lacks an example"
        assert "▌" not in out, f"toolkit {name} --help has text that markdown renders as a quote (a leading '>')"


def test_python_dash_m_and_console_script(tmp_path):
    result = subprocess.run([sys.executable, "-m", "toolkit", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "load" in result.stdout and "inspect" in result.stdout
    script = shutil.which("toolkit", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("console script not installed next to this interpreter")
    result = subprocess.run([script, "load", str(tmp_path / "missing")], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: model ")
    assert "Traceback" not in result.stderr
