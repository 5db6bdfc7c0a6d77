"""New files with the permissions a plain ``open()`` gives, for outputs written through helpers
(safetensors' writer, ``tempfile.mkstemp``) that make them owner-only (0600)."""
from __future__ import annotations

import os
from pathlib import Path


def honour_umask(path: Path | str) -> None:
    """Set ``path`` (and everything under it, if a directory) to 0666/0777 less the process umask,
    so other users of a shared model directory can read what toolkit wrote."""
    path = Path(path)
    umask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        item.chmod((0o777 if item.is_dir() else 0o666) & ~umask)
