"""The default loader: Hugging Face directories of ``*.safetensors`` (or ``pytorch_model*.bin``)."""
from toolkit.core.hookspecs import hookimpl
from toolkit.core.names import HFNameMap

from .checkpoint import HFCheckpoint
from .loader import SafetensorsLoader

__all__ = ["HFCheckpoint", "SafetensorsLoader"]


@hookimpl
def register_loaders(register):
    register(SafetensorsLoader())


@hookimpl
def register_name_maps(register):
    register(HFNameMap(format="safetensors"))
