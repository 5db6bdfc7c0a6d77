"""The default loader: Hugging Face directories of ``*.safetensors`` (or ``pytorch_model*.bin``)."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.names import HFNameMap

from .loader import SafetensorsLoader

_LAZY = {"HFCheckpoint": ".checkpoint"}


def __getattr__(name: str):
    """The names in ``_LAZY``, imported on first use: registration needs only the loader and the
    name map, so a load of another format never imports this format's reader and writer."""
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HFCheckpoint", "SafetensorsLoader"]


@hookimpl
def register_loaders(register):
    register(SafetensorsLoader())


@hookimpl
def register_name_maps(register):
    register(HFNameMap(format="safetensors"))
