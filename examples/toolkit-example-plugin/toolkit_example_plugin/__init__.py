"""toolkit plugin: ``.npz`` weight archives (``config.json`` + ``model.npz`` with Hugging Face names).

Registered through ``[project.entry-points.toolkit]`` in this package's pyproject.toml.
"""
from toolkit import hookimpl
from toolkit.core.names import HFNameMap

from .loader import NpzLoader

__version__ = "0.1.0"


@hookimpl
def register_loaders(register):
    register(NpzLoader())


@hookimpl
def register_name_maps(register):
    # The arrays keep Hugging Face names, so the shared HF name map is all this format needs.
    register(HFNameMap(format=NpzLoader.name))
