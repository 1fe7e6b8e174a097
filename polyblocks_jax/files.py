"""Files that several processes share: our folder in the user's cache, and writes that a
concurrent reader sees whole or not at all."""
from __future__ import annotations

import os
import tempfile


def cache_folder(*names: str) -> str:
    """``$XDG_CACHE_HOME/polyblocks_jax/<names>`` (``~/.cache`` without it); not created."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(root, "polyblocks_jax", *names)


def write_atomically(path: str, data: bytes) -> None:
    """A concurrent reader sees the whole file or none of it."""
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
