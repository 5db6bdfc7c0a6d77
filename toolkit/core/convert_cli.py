"""The ``toolkit convert`` command (the driver is core/convert.py).

Imports no torch by itself: a direct conversion (convert_direct.py: e.g. a file re-quantized
into another of its format) runs without it; everything else goes through the driver.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer



def _overrides(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        pattern, sep, kind = value.rpartition("=")
        if not sep or not pattern:
            raise typer.BadParameter(f"{value!r}: expected GLOB=TYPE, e.g. '*.down_proj.weight=TYPE'")
        pairs.append((pattern, kind))
    return tuple(pairs)


def convert_command(
    source: str = typer.Argument(..., help="Model to read: file, directory or hub id."),
    dest: Path = typer.Argument(..., help="Output path (file or directory, as the target format writes)."),
    to: str = typer.Option(..., "--to", help="Target FORMAT[:TYPE]: a loader that can write (see "
                                             "`toolkit plugins`) and, optionally, the type it should store."),
    source_format: Optional[str] = typer.Option(None, "--format", help="Force the loader used to read SOURCE."),
    override: List[str] = typer.Option([], "--override", help="Per-tensor type, GLOB=TYPE on the Hugging Face "
                                                              "name (repeatable; first match wins)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size, for targets that store per-rank files."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32/fp16/bf16 for model-level writers."),
    force: bool = typer.Option(False, "--force", help="Replace DEST if it exists."),
) -> None:
    """Convert a model between formats and quantization types.

    The output is written under a temporary name beside DEST and renamed only when complete,
    so an interrupted conversion leaves nothing at DEST.

    Example: toolkit convert ./my-llama ./my-llama-bf16 --to safetensors:bf16
    (docs/convert.md in the repository lists every target and type the built-in plugins write)
    """
    from .cli_load import ProgressBar  # noqa: PLC0415 - a bar on terminals only, nothing in logs
    from .convert_direct import convert_direct, direct_plan  # noqa: PLC0415

    overrides = _overrides(override)
    typer.echo(f"converting {source} -> {dest} as {to} (opening the source and its tokenizer)", err=True)
    plan = direct_plan(source, to, overrides=overrides, source_format=source_format) \
        if tp == 1 and dtype is None else None
    bar = ProgressBar("converting")
    try:
        if plan is not None:
            result = convert_direct(plan, dest, force=force, progress=bar)
        else:
            from .config import parse_dtype  # noqa: PLC0415 - the driver and its writers import torch
            from .convert import ConvertOptions, convert  # noqa: PLC0415

            options = ConvertOptions(overrides=overrides, tp=tp, dtype=parse_dtype(dtype))
            result = convert(source, dest, to=to, force=force, options=options, source_format=source_format,
                             progress=bar)
    except KeyboardInterrupt:
        bar.close()
        typer.echo(f"error: interrupted; nothing was written at {dest} (the partial output was removed)", err=True)
        raise typer.Exit(130) from None
    finally:
        bar.close()
    for line in result.summary_lines():
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("convert")(convert_command)
