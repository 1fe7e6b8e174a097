"""Opaque PJRT handles: the address of a small zeroed block, mapped to a Python object.

jaxlib passes handles back to us and, for some kinds (PJRT_Memory at least), reads the
first word to test whether the handle wraps XLA's own C++ object: a null first word
sends it down the plain C API path. So every handle points at zeroed memory that we own;
the table keeps both the block and the object alive until the handle is released.

The other words answer the getters jaxlib asks on every call in C (native.c): word 1 a
tag saying what words 2.. hold, written here with the object (and by the object when a
word changes: a buffer's deletion). A block without a tag is answered in Python.

Native Execute (native.c) makes its output buffers' blocks itself; Python knows such a
handle once a callback names it: the table then adopts it (``_Table.adopt``, set by
native.py).
"""
from __future__ import annotations

import ctypes

_BLOCK = ctypes.c_void_p * 8  # 64 zero bytes: more than jaxlib's probe reads

# Tags of word 1 (the same numbers as native.c's), and what words 2.. then hold:
BUFFER = 0x70620001      # device handle, memory handle, deleted (0/1), ready event handle (0: ask Python),
#                          data address, origin (0 or READ_ONLY: Python; else made by native Execute)
READ_ONLY = 0x70620013   # a buffer of Python's whose memory compiled code may not write (donation)
EXECUTABLE = 0x70620002  # number of outputs
MEMORY = 0x70620003      # kind: address of its characters, their count
READY_EVENT = 0x70620004  # (nothing: ready, without an error)
LOADED_EXECUTABLE = 0x70620005  # the native Execute's plan (0: Python runs every call)
DELETED_WORD = 4
# An untagged device block's word 7: bytes of its buffers that native Execute made and Python never adopted.
DEVICE_NATIVE_BYTES_WORD = 7


class _Table(dict):
    """Handle -> object; a handle it does not hold may be a buffer that native Execute made,
    which ``adopt`` (handle -> object, or None) turns into a Python object on first lookup."""
    adopt = None

    def __missing__(self, handle: int) -> object:
        adopt = self.adopt
        obj = adopt(handle) if adopt is not None and handle else None
        if obj is None:
            raise KeyError(handle)
        return obj


LIVE: dict[int, object] = _Table()
_BLOCKS: dict[int, ctypes.Array] = {}


def register(obj: object, *words: int) -> int:
    """A new handle for ``obj``; ``words`` (a tag, then what it names) fill words 1.. of its block."""
    block = _BLOCK(None, *words)
    handle = ctypes.addressof(block)
    _BLOCKS[handle] = block
    LIVE[handle] = obj
    return handle


def adopt(obj: object, handle: int) -> None:
    """Register ``obj`` under an existing block at ``handle``, made in C (which frees it)."""
    _BLOCKS[handle] = _BLOCK.from_address(handle)
    LIVE[handle] = obj


def word(handle: int, index: int) -> int:
    """Word ``index`` of the block at ``handle`` (0 when it is null)."""
    return ctypes.c_size_t.from_address(handle + index * ctypes.sizeof(ctypes.c_size_t)).value


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
