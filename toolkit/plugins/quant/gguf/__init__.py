"""The ``gguf`` quant scheme: packed GGUF weights on the device, self-sharding parameters."""
from toolkit.core.hookspecs import hookimpl

from .params import GGUFParameter, Segment
from .scheme import GGUFScheme, GGUFSchemeFactory

__all__ = ["GGUFParameter", "GGUFScheme", "GGUFSchemeFactory", "Segment"]


@hookimpl
def register_quant_schemes(register):
    register(GGUFSchemeFactory())
