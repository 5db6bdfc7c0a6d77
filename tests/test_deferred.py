"""Deferred registrations (core/deferred.py): the registry indexes them without importing their
module, lookups return the imported object, and an entry that disagrees with its object fails."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from toolkit.core.arch import ModelArch
from toolkit.core.deferred import Deferred, resolved
from toolkit.core.errors import PluginError
from toolkit.core.plugins import PluginSet
from toolkit.core.registry import Registry, default_registry

MODULE = "tk_test_deferred_model"
PLUGIN = "tk_test_deferred_plugin"
MODEL_SOURCE = """
from toolkit.core.arch import ModelArch
from toolkit.core.names import HFNameMap

ARCH = ModelArch(name="lazy-arch", aliases=("LazyForCausalLM",), config_from=dict, build=None)
NAMES = HFNameMap(format="npz", architecture="lazy-arch")
"""
PLUGIN_SOURCE = """
from toolkit import hookimpl
from toolkit.core.deferred import Deferred

@hookimpl
def register_architectures(register):
    register(Deferred("{module}:ARCH", name="lazy-arch", aliases={aliases!r}))

@hookimpl
def register_name_maps(register):
    register(Deferred("{module}:NAMES", format="npz", architecture="lazy-arch"))
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch, fresh_registry):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(MODEL_SOURCE))
    yield tmp_path
    for name in (MODULE, PLUGIN):
        sys.modules.pop(name, None)


def _registry(directory, aliases=("LazyForCausalLM",)) -> Registry:
    (directory / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE.format(module=MODULE, aliases=aliases))
    plugins = PluginSet()
    plugins.add_module("lazy", PLUGIN)
    return Registry(plugins)


def test_the_registry_indexes_a_deferred_entry_and_imports_it_on_lookup(plugin_dir):
    registry = _registry(plugin_dir)
    assert MODULE not in sys.modules  # registering imported nothing of the model
    assert "LazyForCausalLM" in registry.arch_aliases
    arch = registry.architecture("NoSuchModel", "LazyForCausalLM")
    assert isinstance(arch, ModelArch) and arch is sys.modules[MODULE].ARCH
    assert registry.name_map("npz", "lazy-arch") is sys.modules[MODULE].NAMES
    assert registry.plugins.infos["lazy"].registers == {"architecture": ["lazy-arch"], "name map": ["npz:lazy-arch"]}


def test_an_entry_that_disagrees_with_its_object_fails_naming_both(plugin_dir):
    registry = _registry(plugin_dir, aliases=("LazyForCausalLM", "lazy_text"))
    with pytest.raises(PluginError, match=r"ARCH says aliases=\('LazyForCausalLM', 'lazy_text'\), "
                                          r"the object has \('LazyForCausalLM',\)"):
        registry.architecture("lazy_text")


def test_a_missing_module_or_attribute_is_a_plugin_error():
    with pytest.raises(PluginError, match="tk_test_no_such_module"):
        Deferred("tk_test_no_such_module:ARCH", name="x").resolve()
    with pytest.raises(PluginError, match="NOPE"):
        Deferred("toolkit.plugins.models.llama:NOPE").resolve()
    with pytest.raises(PluginError, match="module:attribute"):
        Deferred("toolkit.plugins.models.llama")
    assert resolved(5) == 5


def test_every_builtin_deferred_registration_matches_its_object():
    registry = default_registry()
    entries = [e for e in (*registry.architectures.values(), *registry.name_maps.values()) if isinstance(e, Deferred)]
    assert len(entries) >= 16  # the six built-in model plugins: ten architectures, six name maps
    for entry in entries:
        assert entry.resolve() is entry.resolve(), entry  # imported once, checked against what it says
    for name, entry in registry.architectures.items():
        assert registry.architecture(name) is resolved(entry)


def test_registering_the_builtins_imports_no_model_module():
    code = ("import sys; from toolkit.core.registry import default_registry; default_registry(); "
            "print(sorted(m for m in sys.modules if m.startswith('toolkit.plugins.models.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert eval(done.stdout.strip().splitlines()[-1]) == ["toolkit.plugins.models.registrations"]


def test_toolkit_plugins_imports_deferred_entries_and_shows_their_failures(plugin_dir):
    (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE.format(module="tk_test_missing_model",
                                                                  aliases=("LazyForCausalLM",)))
    plugins = PluginSet()
    plugins.add_module("lazy", PLUGIN)
    registry = Registry(plugins)
    assert plugins.infos["lazy"].error is None  # registering imported nothing, so nothing failed yet
    registry.check_deferred()
    assert "tk_test_missing_model" in plugins.infos["lazy"].error
    with pytest.raises(PluginError, match="tk_test_missing_model"):
        registry.architecture("lazy-arch")
