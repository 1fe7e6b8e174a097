"""Opaque PJRT handles: the address of a small zeroed block, mapped to a Python object.

jaxlib passes handles back to us and, for some kinds (PJRT_Memory at least), reads the
first word to test whether the handle wraps XLA's own C++ object: a null first word
sends it down the plain C API path. So every handle points at zeroed memory that we own;
the table keeps both the block and the object alive until the handle is released.
"""
from __future__ import annotations

import ctypes

_BLOCK = ctypes.c_void_p * 8  # 64 zero bytes: more than jaxlib's probe reads

LIVE: dict[int, object] = {}
_BLOCKS: dict[int, ctypes.Array] = {}


def register(obj: object) -> int:
    block = _BLOCK()
    handle = ctypes.addressof(block)
    _BLOCKS[handle] = block
    LIVE[handle] = obj
    return handle


def lookup(handle: int | None) -> object:
    try:
        return LIVE[handle]
    except KeyError:
        raise LookupError(f"unknown or destroyed PJRT handle {handle:#x}" if handle else "null PJRT handle") from None


def release(handle: int | None, _live_pop=LIVE.pop, _blocks_pop=_BLOCKS.pop) -> object | None:
    """Forget ``handle``; returns its object. Safe at interpreter exit (no module globals)."""
    _blocks_pop(handle, None)
    return _live_pop(handle, None)
