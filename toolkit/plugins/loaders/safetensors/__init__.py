"""The default loader: Hugging Face directories of ``*.safetensors`` (or ``pytorch_model*.bin``)."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.lazy import lazy_attributes
from toolkit.core.names import HFNameMap

from .loader import SafetensorsLoader

# Imported on first use: registration needs only the loader and the name map, so a load of another
# format never imports this format's reader and writer.
_LAZY = {"HFCheckpoint": ".checkpoint"}


__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = ["HFCheckpoint", "SafetensorsLoader"]


@hookimpl
def register_loaders(register):
    register(SafetensorsLoader())


@hookimpl
def register_name_maps(register):
    register(HFNameMap(format="safetensors"))
