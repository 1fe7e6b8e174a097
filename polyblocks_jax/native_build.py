"""Small C sources of ours, built once with the system's C compiler (``CC``, else ``cc``) into
shared libraries kept in our cache folder, named by a digest of the source: a changed source
builds anew, and concurrent builders never see a partial file."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from typing import Sequence

from polyblocks_jax import files


def shared_library(source: str, name: str, link: Sequence[str] = ()) -> str:
    """The path of ``source`` (a C file) built as a shared library, building it if needed;
    raises OSError or subprocess.SubprocessError where it cannot be built."""
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = files.cache_folder()
    library = os.path.join(cache, f"{name}-{digest}.so")
    if os.path.exists(library):
        return library
    os.makedirs(cache, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=cache, suffix=".so")
    os.close(fd)
    try:
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", partial, source, *link],
                       check=True, capture_output=True)
        os.replace(partial, library)  # atomic
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library
