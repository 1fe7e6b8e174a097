"""Files that several processes share: our folder in the user's cache, and writes that a
concurrent reader sees whole or not at all."""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


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


@functools.cache
def code_digest() -> str:
    """A digest of the package's own source (Python and C): two installs that compile alike
    share it, and an edited or upgraded compiler has another, so caches keyed by it never
    serve code that this compiler would not produce."""
    digest = hashlib.sha256()
    for folder, subfolders, names in sorted(os.walk(_PACKAGE)):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith((".py", ".c"))):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, _PACKAGE).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]
