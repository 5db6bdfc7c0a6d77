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


def test_generate_without_prompts_is_a_usage_error(app, tiny_llama):
    result = CliRunner().invoke(app, ["generate", str(tiny_llama.path)])
    assert result.exit_code != 0 and "--prompt" in result.output


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
