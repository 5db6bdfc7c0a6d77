"""``toolkit serve``: load a model into the batching engine and serve the OpenAI API over HTTP.

``core/cli.py`` calls ``register(app)``. This module imports only typer and the engine's option
definitions; the server's own dependencies (the ``serve`` extra) are imported when it starts.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..engine.commands import (DeviceOpt, DtypeOpt, EnforceEagerOpt, FormatOpt, KvOpt, MaxBatchedTokensOpt,
                               MaxModelLenOpt, MaxNumSeqsOpt, ModelArg, QuantOpt, SeedOpt, TpOpt, _engine)
from ..errors import ToolkitError

SERVE_EXTRA_MODULES = ("fastapi", "uvicorn", "prometheus_client")


class MissingExtraError(ToolkitError):
    """A command needs an optional dependency group (extra) that is not installed."""


def check_serve_extra() -> None:
    missing = [name for name in SERVE_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(f"toolkit serve needs the 'serve' extra (missing: {', '.join(missing)}); "
                                "install it with: pip install 'toolkit[serve]'")


def serve_command(
        model: ModelArg = None,
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
        served_model_name: Annotated[Optional[list[str]], typer.Option(
            "--served-model-name",
            help="Name clients use in 'model' (repeatable; default: MODEL, or the default model's file name).")] = None,
        api_key: Annotated[Optional[str], typer.Option(
            "--api-key", envvar="TOOLKIT_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every route but /health.")] = None,
        max_waiting: Annotated[int, typer.Option(
            "--max-waiting", min=1, help="Most requests queued for admission; more get 503 + Retry-After.")] = 512,
        chat_template: Annotated[Optional[Path], typer.Option(
            "--chat-template", exists=True, dir_okay=False,
            help="Jinja chat template file (default: the tokenizer's; without one, chat requests get a 400).")] = None,
        log_level: Annotated[str, typer.Option(help="uvicorn log level (warning hides per-request lines).")] = "info",
        format: FormatOpt = None, quant: QuantOpt = None, dtype: DtypeOpt = None, device: DeviceOpt = None,
        tp: TpOpt = 1, kv_cache_memory: KvOpt = None, max_num_seqs: MaxNumSeqsOpt = 256,
        max_num_batched_tokens: MaxBatchedTokensOpt = 4096, max_model_len: MaxModelLenOpt = None,
        enforce_eager: EnforceEagerOpt = False, seed: SeedOpt = None) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics), batching concurrent requests in one engine.

    Example:  toolkit serve ./my-llama --port 8000 --api-key secret --max-num-seqs 64
    """
    check_serve_extra()
    from ..cli_load import resolve_model  # noqa: PLC0415 - heavy imports only when the command runs

    reference, is_default = resolve_model(model, format)
    if is_default:
        typer.echo(f"model: {reference} (default of loader {format!r})", err=True)
    names = list(served_model_name or [Path(reference).name if is_default else reference])
    template = chat_template.read_text() if chat_template is not None else None
    llm = _engine(reference, format, quant, dtype, device, tp, kv_cache_memory, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                  enforce_eager=enforce_eager, seed=seed)
    from .server import run  # noqa: PLC0415 - fastapi and uvicorn only once a server starts

    try:
        run(llm, model_names=names, api_key=api_key, max_waiting=max_waiting,
            chat_template=template, host=host, port=port, log_level=log_level)
    finally:
        llm.close()


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the ``toolkit`` app."""
    app.command("serve")(serve_command)
