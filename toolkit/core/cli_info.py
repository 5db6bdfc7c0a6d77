"""``toolkit inspect`` (a checkpoint, without loading weights) and ``toolkit plugins``."""
from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from typing import Annotated, Any

import typer

from .cli_load import FormatOpt, ModelArg, current_registry, resolve_model


# ---- toolkit inspect ---------------------------------------------------------------------
def abridge(value: Any, width: int = 100) -> str:
    """One line for a metadata value: long sequences become ``[N items: a, b, c, ...]``."""
    if hasattr(value, "__len__") and not isinstance(value, (str, bytes, dict)) and len(value) > 8:
        head = ", ".join(repr(item) for item in itertools.islice(iter(value), 3))
        text = f"[{len(value)} items: {head}, ...]"
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


MAX_JSON_ITEMS = 64  # longer arrays (vocabularies, merges) are given as their length and first items


def json_value(value: Any) -> Any:
    """A metadata value as JSON: numbers, strings and booleans as themselves, short sequences as
    lists, long ones as ``{"length": N, "first": [...]}``; anything else as its text."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if hasattr(value, "__len__") and hasattr(value, "__iter__"):
        items = [json_value(item) for item in itertools.islice(iter(value), MAX_JSON_ITEMS)]
        return items if len(value) <= MAX_JSON_ITEMS else {"length": len(value), "first": items[:8]}
    return str(value)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def inspect_data(summary, files, *, as_json: bool = False) -> dict:
    """What ``toolkit inspect`` shows: metadata values as one-line text, or as JSON values."""
    tensors = summary.tensors
    render = json_value if as_json else abridge
    return {"format": summary.format, "architecture": summary.architecture, "files": [str(f) for f in files],
            "metadata": {key: render(value) for key, value in summary.metadata.items()},
            "tensors": {"count": len(tensors), "total_bytes": sum(t.nbytes for t in tensors),
                        "dtypes": dict(Counter(t.dtype for t in tensors)),
                        "rows": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "nbytes": t.nbytes,
                                  "file": t.file} for t in tensors]}}


def _print_inspect(data: dict, rows: int) -> None:
    typer.echo(f"format        {data['format']}\narchitecture  {data['architecture']}")
    for path in data["files"]:
        typer.echo(f"file          {path}")
    typer.echo(f"metadata      {len(data['metadata'])} keys")
    for key, text in data["metadata"].items():
        typer.echo(f"  {key} = {text}")
    table = data["tensors"]
    types = ", ".join(f"{name} {count}" for name, count in sorted(table["dtypes"].items(), key=lambda kv: -kv[1]))
    typer.echo(f"tensors       {table['count']} ({_mib(table['total_bytes'])}); types: {types}")
    shown = table["rows"][:rows]
    width = max((len(row["name"]) for row in shown), default=4)
    for row in shown:
        shape = "x".join(map(str, row["shape"])) or "scalar"
        size = _mib(row["nbytes"])
        typer.echo(f"  {row['name']:<{width}}  {shape:>14}  {row['dtype']:>6}  {size:>11}  {row['file']}")
    if len(table["rows"]) > len(shown):
        typer.echo(f"  ... {len(table['rows']) - len(shown)} more (--all lists every tensor)")


def inspect_command(
    path: ModelArg = None,
    format: FormatOpt = None,
    rows: Annotated[int, typer.Option(min=0, help="Tensor rows to list.")] = 20,
    all: Annotated[bool, typer.Option("--all", help="List every tensor.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (every tensor row).")] = False,
) -> None:
    """Describe a checkpoint without loading its weights.

    Prints the format, architecture, files, metadata (long values abridged) and a tensor
    table summary: count, types histogram, total bytes and the first rows.

    Example:  toolkit inspect ./my-llama --all
    """
    from . import source as sources  # noqa: PLC0415
    from .config import LoadConfig  # noqa: PLC0415
    from .load import pick_loader  # noqa: PLC0415

    reference, _ = resolve_model(path, format)
    source = sources.resolve(reference)
    checkpoint = pick_loader(current_registry(), source, format).open(source, LoadConfig(format=format))
    try:
        data = inspect_data(checkpoint.summary(), checkpoint.files, as_json=as_json)
    finally:
        checkpoint.close()
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        _print_inspect(data, len(data["tensors"]["rows"]) if all else rows)


# ---- toolkit plugins ---------------------------------------------------------------------
def plugin_rows(registry) -> list[dict]:
    """One dict per plugin: name, version, origin, module, what it registers, error."""
    return [{"name": info.name, "version": info.version, "origin": info.origin, "builtin": info.is_builtin,
             "distribution": info.distribution, "module": info.module, "registers": info.registers,
             "error": info.error} for info in sorted(registry.plugins.infos.values(), key=lambda i: i.name)]


def plugins_command(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List installed plugins: version, origin (built-in or distribution) and what each registers.

    Plugins that failed to load are listed with their error; everything else keeps working.
    TOOLKIT_PLUGINS (allow-list) and TOOLKIT_DISABLE_PLUGINS (block-list) take entry-point names.

    Example:  toolkit plugins --json
    """
    registry = current_registry()
    registry.check_deferred()  # what registered without importing is imported here, to show its errors
    rows = plugin_rows(registry)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']} {row['version']}  [{row['origin']}]  {row['module']}")
        if row["error"]:
            typer.echo(f"    FAILED: {row['error']}")
        for kind, names in row["registers"].items():
            typer.echo(f"    {kind}: {', '.join(names)}")
    failed = sum(1 for row in rows if row["error"])
    typer.echo(f"{len(rows)} plugins, {failed} failed")
