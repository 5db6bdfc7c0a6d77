"""``toolkit generate / chat / bench`` through a typer app built the way core/cli.py builds it."""
from __future__ import annotations

import json
import shutil

import pytest
import typer
from typer.testing import CliRunner

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.core.engine import commands

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop", hidden=True)(lambda: None)  # typer flattens a one-command app; keep subcommands
    commands.register(app)
    return app


def invoke(app, *args, input=None):
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def greedy_texts(path, prompts, max_tokens):
    llm = LLM(toolkit.load(path, device="cpu"))
    return [out.text for out in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))]


def test_generate_prints_each_greedy_completion(app, tiny_llama, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("Once upon a time\n\n")
    result = invoke(app, "generate", tiny_llama.path, "--prompt", "Hello, my name is", "--prompts-file", prompts_file,
                    "--max-tokens", 6, "--temperature", 0, "--device", "cpu")
    expected = greedy_texts(tiny_llama.path, ["Hello, my name is", "Once upon a time"], 6)
    assert "Hello, my name is" + expected[0] in result.stdout
    assert "Once upon a time" + expected[1] in result.stdout


def test_generate_stream_prints_the_same_text(app, tiny_llama):
    result = invoke(app, "generate", tiny_llama.path, "-p", "The capital of France is", "--max-tokens", 6,
                    "--temperature", 0, "--stream", "--device", "cpu")
    expected = greedy_texts(tiny_llama.path, ["The capital of France is"], 6)[0]
    assert result.stdout.strip() == ("The capital of France is" + expected).strip()


def test_generate_without_prompts_is_refused_before_loading(app, tiny_llama):
    from toolkit.core.errors import OptionError

    result = CliRunner().invoke(app, ["generate", str(tiny_llama.path)])
    assert isinstance(result.exception, OptionError) and "--prompt" in str(result.exception)


def test_chat_streams_a_reply_per_line(app, tiny_llama, tmp_path):
    model = tmp_path / "chat-model"
    shutil.copytree(tiny_llama.path, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(dict(config, chat_template=TEMPLATE)))
    result = invoke(app, "chat", model, "--temperature", 0, "--max-tokens", 5, "--device", "cpu",
                    input="Hello\n/exit\n")
    llm = LLM(toolkit.load(model, device="cpu"))
    expected = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=5, temperature=0))[0].text
    assert expected in result.stdout


def test_chat_without_a_template_uses_the_plain_transcript(app, tiny_llama):
    from toolkit.core.engine import plain_chat

    result = invoke(app, "chat", tiny_llama.path, "--temperature", 0, "--max-tokens", 5, "--device", "cpu",
                    "--system", "Be brief.", input="Hello\n/exit\n")
    assert "no chat template" in result.stderr
    llm = LLM(toolkit.load(tiny_llama.path, device="cpu"))
    assert not llm.has_chat_template()
    prompt = plain_chat.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    assert prompt == "Be brief.\n\nUser: Hello\nAssistant:"
    params = SamplingParams(max_tokens=5, temperature=0, stop=list(plain_chat.STOP_STRINGS))
    assert llm.generate([prompt], params)[0].text in result.stdout


def test_chat_prompt_without_a_template_is_a_typed_error(tiny_llama):
    from toolkit.core.engine.llm import MissingChatTemplateError

    with pytest.raises(MissingChatTemplateError, match="no chat template"):
        LLM(toolkit.load(tiny_llama.path, device="cpu")).chat_prompt([{"role": "user", "content": "Hi"}])


def test_engine_commands_load_a_loaders_default_model(app, tiny_llama, monkeypatch):
    """``toolkit generate --format F`` without MODEL uses loader F's default (as ``load`` does)."""
    from toolkit.core import cli_load

    monkeypatch.setattr(cli_load, "resolve_model", lambda model, fmt: (str(tiny_llama.path), True))
    result = invoke(app, "generate", "--format", "safetensors", "-p", "Hello", "--max-tokens", 3, "--temperature", 0,
                    "--device", "cpu")
    assert "default of loader 'safetensors'" in result.stderr
    assert "Hello" + greedy_texts(tiny_llama.path, ["Hello"], 3)[0] in result.stdout


def test_bench_prints_a_table_and_writes_json(app, tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    result = invoke(app, "bench", tiny_llama.path, "--batch-sizes", "1,3", "--input-len", 8, "--output-len", 4,
                    "--json", out, "--device", "cpu")
    assert "out tok/s" in result.stdout and "TTFT p50 ms" in result.stdout
    rows = json.loads(out.read_text())["results"]
    assert [row["batch_size"] for row in rows] == [1, 3]
    for row in rows:
        assert row["output_tokens_per_s"] > 0 and row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert row["tpot_p50_ms"] > 0


def test_benchmark_warms_up_each_batch_size_when_asked(monkeypatch):
    """``benchmark.run(..., warmup_each=True)``: an untimed batch of each size and prompt length before its
    measured one (bench/bench_vs_llamacpp.py's steady state); by default one small warm-up for all."""
    from toolkit.core.engine import benchmark

    calls = []
    monkeypatch.setattr(benchmark, "measure", lambda llm, size, input_len, output_len, **kw: calls.append(
        (size, input_len, output_len)) or {"batch_size": size})
    assert benchmark.run(None, [1, 3], 8, 6, warmup_each=True) == [{"batch_size": 1}, {"batch_size": 3}]
    assert calls == [(1, 8, 4), (1, 8, 4), (1, 8, 6), (3, 8, 4), (3, 8, 6)]
    calls.clear()
    benchmark.run(None, [1, 3], 8, 6)
    assert calls == [(1, 8, 4), (1, 8, 6), (3, 8, 6)]
