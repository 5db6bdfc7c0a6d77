"""Direct conversions: a writer plugin that converts some sources itself, without torch.

``toolkit convert`` normally reads the source through its loader, maps every tensor to its
Hugging Face name and hands dense torch tensors to the target's writer (convert.py). For some
pairs a plugin can do better: re-quantizing a file of its own format into another needs no model,
no name round trip and no torch, and torch's import alone is most of that command's time. Such a plugin
names a function in the ``toolkit.direct_convert`` entry-point group under its target format's
name (``myformat = "pkg.module:direct_plan"``); the group is read without importing any other plugin.

Contract: ``direct_plan(source, target_type, *, overrides, source_format) -> plan | None``.
None means "not this one" (the normal driver then converts it, so a plan must decline anything
whose output would differ from the driver's); a plan has ``write(staging, progress) ->
(facts, (source_bytes, tensors, parameters))``, as the driver's writers report them. The plugin
allow/block lists (``TOOLKIT_PLUGINS``, ``TOOLKIT_DISABLE_PLUGINS``) apply by entry-point name;
``TOOLKIT_DIRECT_CONVERT=0`` turns direct conversions off.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from .convert_output import SIDECAR_SUFFIXES, ConvertResult, parse_target, size, staged
from .entry_point_scan import entry_points
from .errors import ConversionError

GROUP = "toolkit.direct_convert"


def direct_plan(source, to: str, *, overrides=(), source_format: str | None = None):
    """The plan of the plugin named as ``to``'s format, or None (no such plugin, or it declines)."""
    if os.environ.get("TOOLKIT_DIRECT_CONVERT", "1") == "0":
        return None
    from .plugins import _is_enabled  # noqa: PLC0415 - the same allow/block lists as plugin discovery

    fmt, kind = parse_target(to)
    for ep, _ in entry_points(GROUP):
        if ep.name == fmt and _is_enabled(ep.name):
            return ep.load()(source, kind, overrides=tuple(overrides), source_format=source_format)
    return None


def convert_direct(plan, dest, *, force: bool = False, progress=None) -> ConvertResult:
    """Run ``plan`` into ``dest`` through the same staging as the driver (nothing at DEST unless complete)."""
    dest = Path(dest)
    if dest.exists() and not force:
        raise ConversionError(f"{dest} exists; pass --force to overwrite it")
    start = time.perf_counter()
    with staged(dest, force) as staging:
        facts, stats = plan.write(staging, progress)
    return ConvertResult(dest, time.perf_counter() - start, stats[0], size(dest), stats[1], stats[2], facts,
                         weight_bytes=size(dest, skip_suffixes=SIDECAR_SUFFIXES))
