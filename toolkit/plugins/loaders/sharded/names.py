"""The ``sharded`` format's name map, registered Deferred (core/deferred.py) by the package: it is
a StoredNameMap, and stored.py (torch, two dataclasses) is imported only by a load of this format."""
from __future__ import annotations

from .stored import StoredNameMap

NAMES = StoredNameMap(format="sharded")
