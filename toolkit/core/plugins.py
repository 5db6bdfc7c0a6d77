"""Plugin discovery: every plugin, built-in or third-party, comes from the ``toolkit`` entry-point group.

A plugin that fails to import is recorded (``failed_plugins``), warned about in one line,
and skipped; ``TOOLKIT_STRICT_PLUGINS=1`` re-raises instead. ``TOOLKIT_PLUGINS`` (comma
list of entry-point names) is an allow-list, ``TOOLKIT_DISABLE_PLUGINS`` a block-list.
"""
from __future__ import annotations

import importlib
import os
import warnings
from importlib.metadata import Distribution, EntryPoint

import pluggy

from . import hookspecs
from .entry_point_scan import entry_points, name_and_version
from .records import Record

GROUP = "toolkit"
BUILTIN_DISTRIBUTION = "toolkit"


class PluginInfo(Record):
    """What ``toolkit plugins`` shows for one plugin. A hand-written record, not a dataclass: every
    load discovers the plugins (records.py says why)."""

    name: str
    module: str
    distribution: str
    version: str
    is_builtin: bool
    error: str | None
    registers: dict[str, list[str]]

    def __init__(self, name: str, module: str, distribution: str, version: str, is_builtin: bool,
                 error: str | None = None, registers: dict[str, list[str]] | None = None):
        self.name = name
        self.module = module
        self.distribution = distribution
        self.version = version
        self.is_builtin = is_builtin
        self.error = error
        self.registers = {} if registers is None else registers

    @property
    def origin(self) -> str:
        return "built-in" if self.is_builtin else f"distribution {self.distribution}"


def _env_list(name: str) -> set[str] | None:
    value = os.environ.get(name)
    return None if value is None else {part.strip() for part in value.split(",") if part.strip()}


def _is_enabled(name: str) -> bool:
    allowed, blocked = _env_list("TOOLKIT_PLUGINS"), _env_list("TOOLKIT_DISABLE_PLUGINS") or set()
    return (allowed is None or name in allowed) and name not in blocked


def _describe(ep: EntryPoint, dist: Distribution | None, dists: dict) -> PluginInfo:
    """``dists`` caches (name, version) per distribution: its plugins share one Distribution object,
    and reading the metadata is a file read and a parse."""
    if id(dist) not in dists:
        dists[id(dist)] = (dist, *name_and_version(dist))  # dist kept: its id stays unique
    _, dist_name, version = dists[id(dist)]
    return PluginInfo(name=ep.name, module=ep.value, distribution=dist_name, version=version,
                      is_builtin=dist_name == BUILTIN_DISTRIBUTION)


class PluginSet:
    """The loaded plugins: a pluggy manager plus what each plugin is and whether it imported."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}

    def load_entry_points(self) -> None:
        seen: set[str] = set()
        dists: dict = {}
        for ep, dist in sorted(entry_points(GROUP), key=lambda found: found[0].name):
            if ep.name in seen or not _is_enabled(ep.name):
                continue  # the same name from two distributions (first one wins) or filtered by env
            seen.add(ep.name)
            self.add(ep.name, lambda ep=ep: ep.load(), _describe(ep, dist, dists))

    def add(self, name: str, load, info: PluginInfo) -> None:
        """Import one plugin in isolation; a failure is recorded, not fatal (unless strict)."""
        self.infos[name] = info
        try:
            module = load()
            self.manager.register(module, name=name)
        except Exception as exc:  # noqa: BLE001 - any plugin bug must not take toolkit down
            if os.environ.get("TOOLKIT_STRICT_PLUGINS") == "1":
                raise
            info.error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"toolkit plugin {name!r} ({info.module}) failed to load: {info.error}", stacklevel=2)

    def add_module(self, name: str, module_name: str) -> None:
        """Register a module that is not an entry point (tests, embedding apps)."""
        info = PluginInfo(name=name, module=module_name, distribution="(runtime)", version="", is_builtin=False)
        self.add(name, lambda: importlib.import_module(module_name), info)

    @property
    def failed(self) -> list[PluginInfo]:
        return [info for info in self.infos.values() if info.error]
