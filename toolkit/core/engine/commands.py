"""Engine commands for the ``toolkit`` CLI: ``generate``, ``chat`` and ``bench``.

``toolkit/core/cli.py`` calls ``register(app)``; nothing here knows a format.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import OptionError

ModelArg = Annotated[Optional[str], typer.Argument(
    metavar="MODEL", help="Local file or directory, or a hub id. Optional with --format when that loader ships a "
                          "default model (see toolkit load --help).")]
FormatOpt = Annotated[Optional[str], typer.Option("--format", "-f", help="Loader to use (default: auto-detect).")]
QuantOpt = Annotated[Optional[str], typer.Option(help="On-the-fly quantization scheme.")]
DtypeOpt = Annotated[Optional[str], typer.Option(help="fp32, fp16 or bf16 (default: fp32 on CPU, 16-bit on GPU).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available).")]
TpOpt = Annotated[int, typer.Option(min=1, help="Tensor-parallel size.")]
KvOpt = Annotated[Optional[str], typer.Option("--kv-cache-memory", help="KV cache size, e.g. 2GiB (default: fit).")]
MaxNumSeqsOpt = Annotated[int, typer.Option("--max-num-seqs", min=1, help="Most requests running at once.")]
MaxBatchedTokensOpt = Annotated[int, typer.Option("--max-num-batched-tokens", min=1,
                                                  help="Token budget of one step (long prompts prefill in chunks).")]
MaxModelLenOpt = Annotated[Optional[int], typer.Option("--max-model-len", min=2,
                                                       help="Longest sequence (default: the model's).")]
EnforceEagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs for decode steps.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", min=1, help="Most new tokens per prompt.")]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, help="0 = greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0: all).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1: off).")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below min_p x the top probability.")]
RepetitionOpt = Annotated[float, typer.Option("--repetition-penalty", help="Above 1.0 discourages repeated tokens.")]
PresenceOpt = Annotated[float, typer.Option("--presence-penalty", help="Subtracted from generated tokens' logits.")]
FrequencyOpt = Annotated[float, typer.Option("--frequency-penalty", help="Subtracted per occurrence.")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Seed for reproducible sampling.")]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")]
StopIdOpt = Annotated[Optional[list[int]], typer.Option("--stop-token-id", help="Stop token id (repeatable).")]


def _engine(model: str | None, format, quant, dtype, device, tp: int, kv_cache_memory, **options):
    """The engine over MODEL, or over loader ``format``'s default model when MODEL is omitted.

    dtype and device are checked before anything loads, so a typo costs no load time.
    """
    from ..cli_load import resolve_model  # noqa: PLC0415 - heavy imports only when a command runs
    from ..config import parse_device, parse_dtype  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415

    parse_dtype(dtype)
    parse_device(device)
    reference, is_default = resolve_model(model, format)
    if is_default:
        typer.echo(f"model: {reference} (default of loader {format!r})", err=True)
    return LLM(reference, format=format, quant=quant, dtype=dtype, device=device, tp=tp,
               kv_cache_memory=kv_cache_memory, **options)


def parse_batch_sizes(text: str) -> list[int]:
    """``"1,8,32"`` -> [1, 8, 32]; OptionError for anything but positive integers."""
    try:
        sizes = [int(size) for size in text.split(",") if size.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise OptionError(f"--batch-sizes {text!r}: give positive integers separated by commas, e.g. 1,8,32")
    return sizes


def _params(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty,
            seed, stop, stop_token_ids):
    from .sampling_params import SamplingParams  # noqa: PLC0415

    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, seed=seed, stop=list(stop or []),
                          stop_token_ids=list(stop_token_ids or []))


def generate_command(
        model: ModelArg = None, prompt: Annotated[Optional[list[str]], typer.Option("--prompt", "-p", help="Prompt (repeatable).")] = None,
        prompts_file: Annotated[Optional[Path], typer.Option("--prompts-file", help="One prompt per line.")] = None,
        stream: Annotated[bool, typer.Option("--stream", help="Print tokens as they are generated.")] = False,
        max_tokens: MaxTokensOpt = 64, temperature: TemperatureOpt = 1.0, top_k: TopKOpt = 0, top_p: TopPOpt = 1.0,
        min_p: MinPOpt = 0.0, repetition_penalty: RepetitionOpt = 1.0, presence_penalty: PresenceOpt = 0.0,
        frequency_penalty: FrequencyOpt = 0.0, seed: SeedOpt = None, stop: StopOpt = None, stop_token_id: StopIdOpt = None,
        format: FormatOpt = None, quant: QuantOpt = None, dtype: DtypeOpt = None, device: DeviceOpt = None,
        tp: TpOpt = 1, kv_cache_memory: KvOpt = None) -> None:
    """Complete prompts with the batching engine (all prompts run as one batch).

    Example:  toolkit generate ./my-llama -p "Hello" -p "The sky is" --max-tokens 32 --temperature 0
    """
    prompts = list(prompt or [])
    if prompts_file is not None:
        prompts += [line for line in prompts_file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise OptionError("give --prompt TEXT (repeatable) or --prompts-file FILE")
    params = _params(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                     frequency_penalty, seed, stop, stop_token_id)
    with _engine(model, format, quant, dtype, device, tp, kv_cache_memory) as llm:
        if stream:
            for text in prompts:
                typer.echo(text, nl=False)
                for out in llm.stream(text, params):
                    typer.echo(out.new_text, nl=False)
                typer.echo()
            return
        for text, out in zip(prompts, llm.generate(prompts, params)):
            typer.echo(f"{text}{out.text}")
            typer.echo(f"[{len(out.token_ids)} tokens, finish: {out.finish_reason}]", err=True)


def chat_command(
        model: ModelArg = None, system: Annotated[Optional[str], typer.Option(help="System message.")] = None,
        max_tokens: MaxTokensOpt = 512, temperature: TemperatureOpt = 0.7, top_p: TopPOpt = 0.95,
        seed: SeedOpt = None, format: FormatOpt = None, quant: QuantOpt = None, dtype: DtypeOpt = None,
        device: DeviceOpt = None, tp: TpOpt = 1, kv_cache_memory: KvOpt = None) -> None:
    """Chat interactively using the model's chat template; replies stream. Type /exit (or Ctrl-D) to leave.

    A model without a chat template (base models, the demo model) gets a plain "User: / Assistant:"
    transcript instead, and a note saying so (toolkit/core/engine/plain_chat.py documents it).

    Example:  toolkit chat Qwen/Qwen2.5-0.5B-Instruct --system "Be brief." --temperature 0.7
    """
    from . import plain_chat  # noqa: PLC0415

    history = [{"role": "system", "content": system}] if system else []
    with _engine(model, format, quant, dtype, device, tp, kv_cache_memory) as llm:
        templated = llm.has_chat_template()
        if not templated:
            typer.echo("note: this model has no chat template; using a plain 'User: / Assistant:' transcript", err=True)
        stops = None if templated else list(plain_chat.STOP_STRINGS)
        params = _params(max_tokens, temperature, 0, top_p, 0.0, 1.0, 0.0, 0.0, seed, stops, None)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if line.strip() in ("/exit", "/quit"):
                break
            history.append({"role": "user", "content": line})
            reply = []
            prompt = llm.chat_prompt(history) if templated else plain_chat.render(history)
            for out in llm.stream(prompt, params):
                typer.echo(out.new_text, nl=False)
                sys.stdout.flush()
                reply.append(out.new_text)
            typer.echo()
            history.append({"role": "assistant", "content": "".join(reply)})


def bench_command(
        model: ModelArg = None,
        batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="Comma-separated batch sizes.")] = "1,8,32",
        input_len: Annotated[int, typer.Option("--input-len", min=1, help="Prompt tokens per request.")] = 128,
        output_len: Annotated[int, typer.Option("--output-len", min=1, help="New tokens per request.")] = 128,
        temperature: TemperatureOpt = 0.0,
        json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the results here.")] = None,
        format: FormatOpt = None, quant: QuantOpt = None, dtype: DtypeOpt = None, device: DeviceOpt = None,
        tp: TpOpt = 1, kv_cache_memory: KvOpt = None) -> None:
    """Throughput and latency of the engine: output tokens/s, TTFT and TPOT percentiles per batch size.

    Example:  toolkit bench ./my-llama --batch-sizes 1,8,32 --input-len 128 --output-len 128 --json bench.json
    """
    from . import benchmark  # noqa: PLC0415
    from .llm import format_memory_report  # noqa: PLC0415

    sizes = parse_batch_sizes(batch_sizes)
    with _engine(model, format, quant, dtype, device, tp, kv_cache_memory, max_num_seqs=max(sizes),
                 enable_prefix_caching=False) as llm:
        memory = llm.memory_report()
        typer.echo(f"cache: {format_memory_report(memory)}")
        rows = benchmark.run(llm, sizes, input_len, output_len, temperature=temperature)
    typer.echo(benchmark.format_table(rows))
    if json_path is not None:
        json_path.write_text(json.dumps({"model": model, "memory": memory, "results": rows}, indent=2))
        typer.echo(f"wrote {json_path}")


def register(app: typer.Typer) -> None:
    """Add ``generate``, ``chat`` and ``bench`` to the ``toolkit`` app."""
    app.command("generate")(generate_command)
    app.command("chat")(chat_command)
    app.command("bench")(bench_command)
