"""Typed lookups over what plugins registered: loaders, quant schemes, architectures, name maps, kernels.

The registry calls each plugin's hook implementations one plugin at a time, so that it
knows who registered what: two plugins claiming one name is a PluginConflictError
naming both. An architecture or name map may be registered as a ``Deferred`` (deferred.py):
the tables hold the entry, and the lookups return its object, imported on first use.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .deferred import Deferred, resolved
from .errors import PluginConflictError, PluginError, UnknownArchitectureError, UnknownNameError
from .plugins import PluginSet


class Registry:
    """Name -> object tables filled from a PluginSet."""

    def __init__(self, plugins: PluginSet):
        self.plugins = plugins
        self.loaders: dict[str, Any] = {}
        self.quant_schemes: dict[str, Any] = {}
        self.architectures: dict[str, Any] = {}
        self.arch_aliases: dict[str, Any] = {}
        self.name_maps: dict[tuple[str, str], Any] = {}
        self.kernels: list[tuple[str, Callable, str, int, str]] = []
        self._owners: dict[tuple[str, Any], str] = {}
        for hook, collect in (("register_loaders", self._add_loader), ("register_quant_schemes", self._add_scheme),
                              ("register_architectures", self._add_arch), ("register_name_maps", self._add_name_map),
                              ("register_kernels", self._add_kernel)):
            self._collect(hook, collect)

    def _collect(self, hook_name: str, collect: Callable) -> None:
        for impl in getattr(self.plugins.manager.hook, hook_name).get_hookimpls():
            register = functools.partial(collect, impl.plugin_name)
            try:
                impl.function(**({"register": register} if "register" in impl.argnames else {}))
            except PluginConflictError:
                raise
            except Exception as exc:  # noqa: BLE001 - isolate the broken plugin, as for imports
                info = self.plugins.infos.get(impl.plugin_name)
                if info is None:
                    raise PluginError(f"plugin {impl.plugin_name!r} failed in {hook_name}: {exc}") from exc
                info.error = f"{hook_name}: {type(exc).__name__}: {exc}"

    def _claim(self, kind: str, key: Any, owner: str) -> None:
        first = self._owners.get((kind, key))
        if first is not None and first != owner:
            raise PluginConflictError(kind, str(key), first, owner)
        self._owners[(kind, key)] = owner
        info = self.plugins.infos.get(owner)
        if info is not None:
            info.registers.setdefault(kind, []).append(str(key))

    def _add_loader(self, owner: str, loader) -> None:
        self._claim("loader", loader.name, owner)
        self.loaders[loader.name] = loader

    def _add_scheme(self, owner: str, factory) -> None:
        for name in factory.names:
            self._claim("quant scheme", name, owner)
            self.quant_schemes[name] = factory

    def _add_arch(self, owner: str, arch) -> None:
        self._claim("architecture", arch.name, owner)
        self.architectures[arch.name] = arch
        for alias in (arch.name, *arch.aliases):
            first = self._owners.get(("alias", alias))
            if first is not None and self.arch_aliases[alias] is not arch:
                raise PluginConflictError("architecture alias", alias, first, owner)
            self._owners[("alias", alias)] = owner
            self.arch_aliases[alias] = arch

    def _add_name_map(self, owner: str, name_map) -> None:
        key = (name_map.format, name_map.architecture)
        self._claim("name map", _name_map_key(key), owner)
        self.name_maps[key] = name_map

    def _add_kernel(self, owner: str, op_name: str, impl: Callable, device: str = "any", priority: int = 0) -> None:
        info = self.plugins.infos.get(owner)
        if info is not None:
            info.registers.setdefault("kernel op", []).append(f"{op_name} ({device})")
        self.kernels.append((op_name, impl, device, priority, owner))

    def check_deferred(self) -> None:
        """Import every deferred entry, recording a failure as its plugin's error. ``toolkit plugins``
        calls this, so that a model module that does not import is shown there, as a plugin module
        that does not import is; a load imports only what it looks up."""
        entries = [(("architecture", name), entry) for name, entry in self.architectures.items()]
        entries += [(("name map", _name_map_key(key)), entry) for key, entry in self.name_maps.items()]
        for claim, entry in entries:
            if not isinstance(entry, Deferred):
                continue
            try:
                entry.resolve()
            except PluginError as exc:
                info = self.plugins.infos.get(self._owners.get(claim, ""))
                if info is not None and info.error is None:
                    info.error = str(exc)

    # ---- lookups -------------------------------------------------------------------------
    def loader(self, name: str):
        if name not in self.loaders:
            raise UnknownNameError("loader", name, list(self.loaders))
        return self.loaders[name]

    def quant_scheme(self, name: str):
        if name not in self.quant_schemes:
            raise UnknownNameError("quant scheme", name, list(self.quant_schemes))
        return self.quant_schemes[name]

    def architecture(self, *candidates: str | None):
        """The first candidate (HF architectures entry, model_type, ...) some plugin answers to."""
        for name in candidates:
            if name and name in self.arch_aliases:
                return resolved(self.arch_aliases[name])
        wanted = next((c for c in candidates if c), "(none given)")
        raise UnknownArchitectureError(wanted, sorted(self.arch_aliases))

    def name_map(self, fmt: str, arch_name: str):
        for key in ((fmt, arch_name), (fmt, "*")):
            if key in self.name_maps:
                return resolved(self.name_maps[key])
        raise UnknownNameError("name map", _name_map_key((fmt, arch_name)), [_name_map_key(k) for k in self.name_maps])


def _name_map_key(key: tuple[str, str]) -> str:
    """``format:architecture``: how a name map's key is claimed and shown."""
    return f"{key[0]}:{key[1]}"


@functools.lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The process-wide registry over all installed, enabled plugins (built once)."""
    plugins = PluginSet()
    plugins.load_entry_points()
    registry = Registry(plugins)
    from ..kernels import runtime  # noqa: PLC0415 - kernels are filled from the same plugins

    runtime.install(registry.kernels)
    return registry


def reset_default_registry() -> None:
    """Forget the cached registry (tests that change TOOLKIT_* variables call this)."""
    default_registry.cache_clear()
