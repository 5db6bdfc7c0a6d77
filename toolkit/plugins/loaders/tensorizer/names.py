"""The ``tensorizer`` format's name map, registered Deferred (core/deferred.py) by the package: it is
a StoredNameMap, and the sharded plugin's stored.py (torch, two dataclasses) is imported only by a
load of this format. (Not in checkpoint.py: that imports tensorizer, an optional dependency.)"""
from __future__ import annotations

from toolkit.plugins.loaders.sharded.stored import StoredNameMap

NAMES = StoredNameMap(format="tensorizer")
