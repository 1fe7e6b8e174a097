"""Opaque PJRT handles: the address of a small zeroed block, mapped to a Python object.

jaxlib passes handles back to us and, for some kinds (PJRT_Memory at least), reads the
first word to test whether the handle wraps XLA's own C++ object: a null first word
sends it down the plain C API path. So every handle points at zeroed memory that we own;
the table keeps both the block and the object alive until the handle is released.

The other words answer the getters jaxlib asks on every call in C (native.c): word 1 a
tag saying what words 2.. hold, written here with the object (and by the object when a
word changes: a buffer's deletion). A block without a tag is answered in Python.
"""
from __future__ import annotations

import ctypes

_BLOCK = ctypes.c_void_p * 8  # 64 zero bytes: more than jaxlib's probe reads

# Tags of word 1 (the same numbers as native.c's), and what words 2.. then hold:
BUFFER = 0x70620001      # device handle, memory handle, deleted (0/1), ready event handle (0: ask Python)
EXECUTABLE = 0x70620002  # number of outputs
MEMORY = 0x70620003      # kind: address of its characters, their count
READY_EVENT = 0x70620004  # (nothing: ready, without an error)
DELETED_WORD = 4

LIVE: dict[int, object] = {}
_BLOCKS: dict[int, ctypes.Array] = {}


def register(obj: object, *words: int) -> int:
    """A new handle for ``obj``; ``words`` (a tag, then what it names) fill words 1.. of its block."""
    block = _BLOCK(None, *words)
    handle = ctypes.addressof(block)
    _BLOCKS[handle] = block
    LIVE[handle] = obj
    return handle


def lookup(handle: int | None) -> object:
    try:
        return LIVE[handle]
    except KeyError:
        raise LookupError(f"unknown or destroyed PJRT handle {handle:#x}" if handle else "null PJRT handle") from None


def set_word(handle: int, index: int, value: int) -> None:
    """Word ``index`` of ``handle``'s block (native getters read it), if still registered
    (Destroy releases a buffer's handle before deleting it)."""
    block = _BLOCKS.get(handle)
    if block is not None:
        block[index] = value


def release(handle: int | None, _live_pop=LIVE.pop, _blocks_pop=_BLOCKS.pop) -> object | None:
    """Forget ``handle``; returns its object. Safe at interpreter exit (no module globals)."""
    _blocks_pop(handle, None)
    return _live_pop(handle, None)
