"""``toolkit load``: load a model with a progress bar, print its summary, complete a prompt.

Nothing here knows a format: a model-less ``toolkit load --format F`` asks loader F for its
optional ``default_model()``.
"""
from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

import typer

from .errors import SourceError, ToolkitError
from .units import format_rate

DEFAULT_PROMPT = "The capital of France is"
DTYPE_CHOICES = ("fp32", "fp16", "bf16", "float32", "float16", "bfloat16")

ModelArg = Annotated[Optional[str], typer.Argument(
    metavar="MODEL", help="Local file or directory, or a hub id (org/name[:QUANT]). "
                          "Optional with --format when that loader ships a default.")]
FormatOpt = Annotated[Optional[str], typer.Option("--format", "-f", help="Loader to use (default: auto-detect).")]


def current_registry():
    """The process-wide plugin registry (built on first use)."""
    from .registry import default_registry  # noqa: PLC0415 - imports torch and every plugin

    return default_registry()


def resolve_model(model: str | None, fmt: str | None) -> tuple[str, bool]:
    """``(reference, is_default)``: the given model, or the default that loader ``fmt`` ships."""
    if model:
        return model, False
    if not fmt:
        raise SourceError("no MODEL given: pass a path or hub id, "
                          "or --format F for a loader that ships a default model")
    loader = current_registry().loader(fmt)
    default_model = getattr(loader, "default_model", None)
    if default_model is None:
        raise SourceError(f"loader {fmt!r} ships no default model; pass MODEL")
    return str(default_model()), True


class ProgressBar:
    """Adapts the loader's ``progress(done, total, name)`` callback to a tqdm bar on stderr.

    The bar is created on the first call (when the total is known) and hidden when stderr
    is not a terminal, so logs and tests stay clean.
    """

    def __init__(self, desc: str = "loading", *, disable: bool | None = None):
        self.desc, self.disable, self.bar = desc, disable, None

    def __call__(self, done: int, total: int, name: str) -> None:
        if self.bar is None:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=total, desc=self.desc, unit="tensor", file=sys.stderr, disable=self.disable,
                            dynamic_ncols=True)
        self.bar.set_postfix_str(name[-40:], refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _complete(loaded, prompt: str, max_tokens: int) -> None:
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise ToolkitError("this checkpoint has no tokenizer; pass --tokenizer PATH to complete a prompt")
    start = time.perf_counter()
    new_ids = loaded.generate(tokenizer.encode(prompt), max_tokens)
    seconds = time.perf_counter() - start
    text = tokenizer.decode(new_ids, skip_special_tokens=True)
    rate = len(new_ids) / max(seconds, 1e-9)
    typer.echo(f"completion    {len(new_ids)} tokens in {seconds:.2f}s ({format_rate(rate)} tok/s)")
    typer.echo(f"\n{prompt}{text}")


# ---- toolkit load ------------------------------------------------------------------------
def load_command(
    model: ModelArg = None,
    format: FormatOpt = None,
    quant: Annotated[Optional[str], typer.Option(help="On-the-fly quantization scheme (see toolkit plugins).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help=f"Weight/activation dtype: {', '.join(DTYPE_CHOICES)}.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available).")] = None,
    tp: Annotated[int, typer.Option(min=1, help="Tensor-parallel size (starts that many worker processes).")] = 1,
    expert_parallel: Annotated[Optional[bool], typer.Option(
        "--expert-parallel/--no-expert-parallel",
        help="MoE at --tp > 1: whole experts per rank, or every expert split (default: the config's).")] = None,
    prompt: Annotated[Optional[str], typer.Option(help="Complete this text greedily after loading.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most new tokens for --prompt.")] = 32,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer directory overriding the checkpoint's.")] = None,
) -> None:
    """Load a model through the plugins, print what was loaded, and complete a prompt.

    Shows a progress bar while tensors stream in, then the architecture, parameter count,
    format, quantization scheme, bytes read, time and GB/s. With --prompt, prints the greedy
    completion. With no MODEL, --format F loads the default model that loader F ships (and
    completes a default prompt).

    Example:  toolkit load ./my-llama --dtype bf16 --prompt "Hello, my name is" --max-tokens 20
    """
    from .config import parse_device, parse_dtype  # noqa: PLC0415 - torch only once a command runs

    parse_dtype(dtype)
    parse_device(device)  # before any load time is spent
    reference, is_default = resolve_model(model, format)
    if is_default:
        typer.echo(f"model         {reference} (default of loader {format!r})")
        prompt = prompt or DEFAULT_PROMPT
    from .api import load  # noqa: PLC0415

    bar = ProgressBar()
    try:
        loaded = load(reference, format=format, quant=quant, dtype=dtype, device=device, tp=tp, tokenizer=tokenizer,
                      progress=bar, expert_parallel=expert_parallel)
    finally:
        bar.close()
    try:
        for line in loaded.report.summary_lines():
            typer.echo(line)
        if prompt:
            _complete(loaded, prompt, max_tokens)
    finally:
        loaded.close()
