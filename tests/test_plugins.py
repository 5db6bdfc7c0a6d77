"""Plugin isolation, allow/block lists, conflicts, plugin CLI commands.

Test plugins are real modules written to a temporary directory; "installed" ones come with a
real ``*.dist-info`` (METADATA + entry_points.txt) on sys.path, found by importlib.metadata
exactly as a pip-installed plugin would be.
"""
from __future__ import annotations

import json
import sys
import textwrap
import warnings

import pytest

import toolkit
from toolkit.core import cli
from toolkit.core.errors import PluginConflictError, UnknownArchitectureError
from toolkit.core.plugins import PluginSet
from toolkit.core.registry import Registry, default_registry

PREFIX = "tk_test_"
BROKEN = "raise RuntimeError('boom: this plugin is broken on purpose')\n"
LOADER = """
from toolkit import hookimpl

class Loader:
    name = {name!r}
    def detect(self, source):
        return None
    def open(self, source, load_config):
        raise NotImplementedError

@hookimpl
def register_loaders(register):
    register(Loader())
"""
ARCH = """
from toolkit import hookimpl
from toolkit.core.arch import ModelArch

@hookimpl
def register_architectures(register):
    register(ModelArch(name={name!r}, aliases=("SharedForCausalLM",), config_from=None, build=None))
"""
SCHEME = """
from toolkit import hookimpl

class Factory:
    names = ("shared-scheme",)

@hookimpl
def register_quant_schemes(register):
    register(Factory())
"""
NAME_MAP = """
from toolkit import hookimpl
from toolkit.core.names import HFNameMap

@hookimpl
def register_name_maps(register):
    register(HFNameMap(format="shared-format"))
"""
COMMAND = """
import typer
from toolkit import hookimpl

@hookimpl
def register_commands(app):
    @app.command({name!r})
    def hello(who: str = "world"):
        \"\"\"Say hello.

        Example: toolkit {name} --who you
        \"\"\"
        typer.echo(f"hello {{who}} from {name}")
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch, fresh_registry):
    """A sys.path entry for test plugin modules; modules and registry are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(PREFIX)]:
        del sys.modules[name]


def write(directory, module: str, source: str) -> str:
    (directory / f"{module}.py").write_text(textwrap.dedent(source))
    return module


def install_dist(directory, entry_points: dict[str, str], name="tk-test-dist", version="1.2.3") -> None:
    """A minimal installed distribution whose entry points are in the ``toolkit`` group."""
    info = directory / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "\n".join(f"{ep} = {module}" for ep, module in entry_points.items())
    (info / "entry_points.txt").write_text(f"[toolkit]\n{lines}\n")


def plugin_set(directory, **modules: str) -> PluginSet:
    """A PluginSet holding the given ``plugin name -> module source`` (no entry points)."""
    plugins = PluginSet()
    for name, source in modules.items():
        plugins.add_module(name, write(directory, PREFIX + name.replace("-", "_"), source))
    return plugins


# ---- isolation ----------------------------------------------------------------------------
def test_broken_plugin_is_named_and_the_rest_works(plugin_dir):
    with pytest.warns(UserWarning, match=r"plugin 'broken' \(tk_test_broken\) failed to load: RuntimeError: boom"):
        plugins = plugin_set(plugin_dir, good=LOADER.format(name="good-loader"), broken=BROKEN)
    assert [info.name for info in plugins.failed] == ["broken"]
    assert "boom" in plugins.infos["broken"].error and plugins.infos["good"].error is None
    assert list(Registry(plugins).loaders) == ["good-loader"]


def test_strict_mode_reraises(plugin_dir, monkeypatch):
    monkeypatch.setenv("TOOLKIT_STRICT_PLUGINS", "1")
    with pytest.raises(RuntimeError, match="boom"):
        plugin_set(plugin_dir, broken=BROKEN)


def test_installed_broken_plugin_shows_in_cli_and_loading_still_works(plugin_dir, tiny_llama, capsys):
    write(plugin_dir, "tk_test_broken", BROKEN)
    write(plugin_dir, "tk_test_good", LOADER.format(name="good-loader"))
    install_dist(plugin_dir, {"tk-broken": "tk_test_broken", "tk-good": "tk_test_good"})
    with pytest.warns(UserWarning, match="'tk-broken'"), pytest.raises(SystemExit):
        cli.main(["plugins", "--json"])
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert "RuntimeError: boom" in rows["tk-broken"]["error"]
    good = rows["tk-good"]
    assert (good["version"], good["origin"], good["builtin"], good["error"]) == \
        ("1.2.3", "distribution tk-test-dist", False, None)
    assert rows["tk-good"]["registers"] == {"loader": ["good-loader"]}
    assert rows["safetensors"]["error"] is None
    with pytest.raises(SystemExit):
        cli.main(["plugins"])
    assert "tk-broken 1.2.3  [distribution tk-test-dist]  tk_test_broken\n    FAILED: RuntimeError: boom" in \
        capsys.readouterr().out
    assert toolkit.load(tiny_llama.path, device="cpu").report.format == "safetensors"


# ---- allow / block lists ------------------------------------------------------------------
def test_allow_list_keeps_only_named_plugins(plugin_dir, monkeypatch, tiny_llama):
    write(plugin_dir, "tk_test_broken", BROKEN)
    install_dist(plugin_dir, {"tk-broken": "tk_test_broken"})
    wanted = {"safetensors", "llama", "unquantized", "reference-kernels"}
    monkeypatch.setenv("TOOLKIT_PLUGINS", ",".join(wanted))
    registry = default_registry()
    assert set(registry.plugins.infos) == wanted and not registry.plugins.failed
    with pytest.raises(UnknownArchitectureError, match="known architectures: .*llama") as info:
        registry.architecture("Qwen2ForCausalLM", "qwen2")
    assert "qwen2" not in info.value.known
    assert toolkit.load(tiny_llama.path, device="cpu").report.architecture == "llama"  # a minimal toolkit works


def test_block_list_drops_named_plugins(plugin_dir, monkeypatch):
    write(plugin_dir, "tk_test_broken", BROKEN)
    install_dist(plugin_dir, {"tk-broken": "tk_test_broken"})
    monkeypatch.setenv("TOOLKIT_DISABLE_PLUGINS", "qwen, tk-broken")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry = default_registry()
    assert not [w for w in caught if "tk-broken" in str(w.message)]
    assert "qwen" not in registry.plugins.infos and "tk-broken" not in registry.plugins.infos
    assert "llama" in registry.plugins.infos and "qwen2" not in registry.arch_aliases


# ---- conflicts ----------------------------------------------------------------------------
@pytest.mark.parametrize("first, second, message", [
    (LOADER.format(name="dup"), LOADER.format(name="dup"), "loader 'dup'"),
    (ARCH.format(name="arch-a"), ARCH.format(name="arch-b"), "architecture alias 'SharedForCausalLM'"),
    (SCHEME, SCHEME, "quant scheme 'shared-scheme'"),
    (NAME_MAP, NAME_MAP, "name map 'shared-format:*'"),
])
def test_two_plugins_claiming_one_name_is_an_error_naming_both(plugin_dir, first, second, message):
    plugins = plugin_set(plugin_dir, **{"plugin-one": first, "plugin-two": second})
    with pytest.raises(PluginConflictError) as info:
        Registry(plugins)
    text = str(info.value)
    assert message in text and "'plugin-one'" in text and "'plugin-two'" in text


def test_conflict_with_a_builtin_names_the_builtin(plugin_dir):
    plugins = PluginSet()
    plugins.load_entry_points()
    plugins.add_module("impostor", write(plugin_dir, "tk_test_impostor", LOADER.format(name="safetensors")))
    with pytest.raises(PluginConflictError, match="loader 'safetensors' is registered by both plugin "
                                                  "'safetensors' and plugin 'impostor'"):
        Registry(plugins)


# ---- plugin commands ----------------------------------------------------------------------
def test_plugin_command_runs_and_is_listed(plugin_dir):
    plugins = plugin_set(plugin_dir, greeter=COMMAND.format(name="hello"))
    registry = Registry(plugins)
    app = cli.build_app(registry)
    assert "hello" in cli.command_names(app)
    assert registry.plugins.infos["greeter"].registers == {"command": ["hello"]}
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["hello", "--who", "tests"])
    assert result.exit_code == 0 and result.output == "hello tests from hello\n"


@pytest.mark.parametrize("second_name, owner", [("hello", "'one'"), ("load", "'toolkit'")])
def test_command_name_conflicts_name_both(plugin_dir, second_name, owner):
    plugins = plugin_set(plugin_dir, one=COMMAND.format(name="hello"), two=COMMAND.format(name=second_name))
    with pytest.raises(PluginConflictError, match=rf"command '{second_name}' is registered by both plugin "
                                                  rf"{owner} and plugin 'two'"):
        cli.build_app(Registry(plugins))


def test_broken_register_commands_is_isolated(plugin_dir):
    source = "from toolkit import hookimpl\n\n@hookimpl\ndef register_commands(app):\n    raise ValueError('nope')\n"
    plugins = plugin_set(plugin_dir, clumsy=source)
    with pytest.warns(UserWarning, match="'clumsy' failed to add commands: nope"):
        app = cli.build_app(Registry(plugins))
    assert "load" in cli.command_names(app)
    assert plugins.infos["clumsy"].error == "register_commands: ValueError: nope"


def test_registering_every_plugin_imports_no_heavy_optional_library():
    """Registration is what every process (each tensor-parallel worker too) pays: bitsandbytes and
    tensorizer take seconds to import and are imported only when a model needs them."""
    import subprocess  # noqa: PLC0415

    code = ("import sys; from toolkit.core.registry import default_registry; r = default_registry(); "
            "print([name for name in ('bitsandbytes', 'tensorizer') if name in sys.modules]); "
            "print(sorted(r.quant_schemes))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert {"bnb", "bnb-nf4", "bnb-int8", "gguf"} <= set(json.loads(out[1].replace("'", '"')))
