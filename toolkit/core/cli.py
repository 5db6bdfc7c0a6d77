"""The ``toolkit`` command line: ``load``, ``inspect``, ``plugins``, plus the commands the engine,
the converter and plugins add (``register_commands`` hook; two owners of one command name
is a PluginConflictError).

A ToolkitError prints one line (``error: ...``) and exits with status 1; ``TOOLKIT_DEBUG=1``
shows the traceback instead.

``toolkit convert ...`` builds an app of that one command, without plugin discovery (which
imports every plugin, and with them torch): no plugin can own ``convert`` (the core adds it
before any plugin, and a second owner is a PluginConflictError), and a conversion that needs no
model (convert_direct.py) then runs without importing torch at all.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

import typer

from .cli_info import inspect_command, plugins_command
from .cli_load import current_registry, load_command
from . import threads
from .errors import PluginConflictError, ToolkitError

# Core modules that add commands with ``register(app)``; any may be absent in a given build.
CORE_COMMAND_MODULES = ("toolkit.core.engine.commands", "toolkit.core.convert_cli", "toolkit.core.serve.commands")


def command_names(app: typer.Typer) -> list[str]:
    names = [info.name or info.callback.__name__.lower().replace("_", "-") for info in app.registered_commands]
    return names + [info.name or info.typer_instance.info.name for info in app.registered_groups]


def _claim_new_commands(app: typer.Typer, owners: dict[str, str], owner: str) -> list[str]:
    """Record who added each new command; two owners of one name is a PluginConflictError."""
    new = command_names(app)[len(owners):]
    for name in new:
        if name in owners:
            raise PluginConflictError("command", name, owners[name], owner)
        owners[name] = owner
    return new


def _warn_or_raise(message: str) -> None:
    """Called from an ``except`` block: warn in one line, or re-raise the exception being handled."""
    if os.environ.get("TOOLKIT_STRICT_PLUGINS") == "1" or os.environ.get("TOOLKIT_DEBUG") == "1":
        raise
    warnings.warn(message, stacklevel=3)


def _add_core_commands(app: typer.Typer, owners: dict[str, str]) -> None:
    for module_name in CORE_COMMAND_MODULES:
        try:
            importlib.import_module(module_name).register(app)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue  # that part of toolkit is not in this build
            _warn_or_raise(f"commands of {module_name} are unavailable: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - load/inspect/plugins must keep working
            _warn_or_raise(f"commands of {module_name} are unavailable: {type(exc).__name__}: {exc}")
        else:
            _claim_new_commands(app, owners, module_name)


def _add_plugin_commands(app: typer.Typer, owners: dict[str, str], registry) -> None:
    for impl in registry.plugins.manager.hook.register_commands.get_hookimpls():
        info = registry.plugins.infos.get(impl.plugin_name)
        try:
            impl.function(app=app)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the CLI down
            if info is not None:
                info.error = f"register_commands: {type(exc).__name__}: {exc}"
            _warn_or_raise(f"toolkit plugin {impl.plugin_name!r} failed to add commands: {exc}")
            continue
        new = _claim_new_commands(app, owners, impl.plugin_name)
        if info is not None and new:
            info.registers.setdefault("command", []).extend(new)


def _root_app() -> typer.Typer:
    return typer.Typer(name="toolkit", no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
                       help="Load any LLM checkpoint format through plugins, shard it, run it.")


def build_app(registry=None) -> typer.Typer:
    """The root app: built-in commands, then core extras, then every plugin's ``register_commands``."""
    app = _root_app()
    app.command("load")(load_command)
    app.command("inspect")(inspect_command)
    app.command("plugins")(plugins_command)
    owners = {name: "toolkit" for name in command_names(app)}
    _add_core_commands(app, owners)
    _add_plugin_commands(app, owners, registry or current_registry())
    return app


def build_convert_app() -> typer.Typer:
    """``toolkit convert`` alone (see the module docstring); a no-op callback keeps it a group, so
    the command line and ``toolkit convert --help`` read as in the full app."""
    from . import convert_cli  # noqa: PLC0415

    app = _root_app()
    app.callback()(lambda: None)
    convert_cli.register(app)
    return app


def _app_for(argv: list[str] | None) -> typer.Typer:
    args = sys.argv[1:] if argv is None else argv
    return build_convert_app() if args[:1] == ["convert"] else build_app()


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``toolkit``, ``python -m toolkit``).

    Every failure ends in one ``error: ...`` line on stderr and a non-zero status: a ToolkitError
    or an option the command line could not parse (status 1 and 2; ``TOOLKIT_DEBUG=1`` shows
    the traceback), and Ctrl-C (status 130).
    """
    debug = os.environ.get("TOOLKIT_DEBUG") == "1"
    threads.enable()  # a command owns its process: fit CPU threads to the cores others leave free
    original_format = warnings.formatwarning
    if not debug:
        warnings.formatwarning = _one_line_warning
    try:
        sys.exit(_run(typer.main.get_command(_app_for(argv)), argv))
    except ToolkitError as exc:
        if debug:
            raise
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    finally:
        warnings.formatwarning = original_format


def _run(command, argv: list[str] | None) -> int:
    """Run the click command without its own error handling; click's usage errors become one line."""
    # typer (0.29 vendors its own click) exports Exit, Abort and the base of click's errors.
    try:
        status = command.main(args=argv, prog_name="toolkit", standalone_mode=False)
        return status if isinstance(status, int) else 0  # a command's typer.Exit(code) comes back here
    except typer.Exit as exc:  # --help and friends
        return exc.exit_code
    except typer.Abort:
        raise KeyboardInterrupt from None
    except typer.TyperException as exc:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare ``toolkit``: show the help
            typer.echo(ctx.get_help())
            return 0
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        _fail(exc.format_message() + hint, getattr(exc, "exit_code", 2))
    return 0


def _fail(message: str, status: int) -> None:
    typer.echo(f"error: {message}", err=True)
    sys.exit(status)
