"""The whole plugin contract.

A plugin is any module (or object) with functions marked ``@toolkit.hookimpl`` and named
after the hooks below. It is found through the ``toolkit`` entry-point group, the same
group toolkit's own built-ins use::

    # pyproject.toml of a third-party plugin
    [project.entry-points.toolkit]
    my_format = "my_package.plugin"

Hooks are register-callbacks (simonw/llm style): each receives a ``register`` function
and calls it once per object it provides. Implementations may declare only the arguments
they use, so later releases can pass more without breaking existing plugins.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("toolkit")
hookimpl = pluggy.HookimplMarker("toolkit")


@hookspec
def register_loaders(register):
    """Provide checkpoint loaders (and writers).

    :param register: call ``register(loader)`` with an object satisfying
        :class:`toolkit.core.checkpoint.Loader`: ``name``, ``detect(source) -> float | None``,
        ``open(source, load_config) -> Checkpoint`` and optionally
        ``save(loaded_model, dest, options)``.

    Example::

        @hookimpl
        def register_loaders(register):
            register(NpzLoader())
    """


@hookspec
def register_quant_schemes(register):
    """Provide quantization schemes.

    :param register: call ``register(factory)`` with a
        :class:`toolkit.core.quant.QuantSchemeFactory`: ``names`` it answers to,
        ``from_checkpoint(quant_metadata)`` for pre-quantized files and
        ``from_options(options)`` for on-the-fly quantization (``--quant NAME``).

    Example::

        @hookimpl
        def register_quant_schemes(register):
            register(MyInt8Factory())   # answers to "my-int8"
    """


@hookspec
def register_architectures(register):
    """Provide model architectures.

    :param register: call ``register(arch)`` with a :class:`toolkit.core.arch.ModelArch`:
        ``name``, ``aliases`` (HF ``architectures`` entries, ``model_type``, the architecture
        key of a format's own metadata), ``packed_modules``, ``config_from(hf_config)`` and
        ``build(config, quant, parallel)``.

    Example::

        @hookimpl
        def register_architectures(register):
            register(ModelArch(name="llama", aliases=("LlamaForCausalLM", "mistral"), ...))

    Or, so that registering imports none of the model's code, a
    :class:`toolkit.core.deferred.Deferred` naming the object and what the registry indexes it by::

        register(Deferred("my_plugin.model:ARCH", name="mine", aliases=("MineForCausalLM",)))
    """


@hookspec
def register_name_maps(register):
    """Provide checkpoint-name -> model-parameter mappings for a (format, architecture).

    :param register: call ``register(name_map)`` with a :class:`toolkit.core.names.NameMap`:
        ``format``, ``architecture`` (``"*"`` for any) and ``map(name, context) -> MappedName | None``
        returning the canonical parameter, shard id and an optional value transform.
        ``None`` marks a tensor the model does not use (and is not an error).

    Example::

        @hookimpl
        def register_name_maps(register):
            register(TableNameMap(format="npz", architecture="llama", table={"tok": "model.embed_tokens.weight"}))

    A :class:`toolkit.core.deferred.Deferred` with ``format`` and ``architecture`` defers the import.
    """


@hookspec
def register_commands(app):
    """Add commands to the ``toolkit`` CLI.

    :param app: the root :class:`typer.Typer`; use ``@app.command()``.

    Example::

        @hookimpl
        def register_commands(app):
            @app.command()
            def hello():
                print("hi")
    """


@hookspec
def register_kernels(register):
    """Provide ops for the kernel runtime.

    :param register: call ``register(op_name, impl, device="cpu"|"cuda"|"any", priority=0)``.
        The highest-priority implementation whose device matches (and whose optional
        ``supports(*args)`` accepts the call) runs; ``device="any"`` references are the oracle.

    Example::

        @hookimpl
        def register_kernels(register):
            register("rms_norm", my_triton_rms_norm, device="cuda", priority=10)
    """
