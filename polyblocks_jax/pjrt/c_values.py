"""Values handed to jaxlib by address: they keep their memory, at one address, while they live."""
from __future__ import annotations

import ctypes

from polyblocks_jax.runtime.foreign_memory import array_type


class Text:
    """A UTF-8 string with a stable address, handed to jaxlib as (pointer, size)."""
    __slots__ = ("buffer", "address", "size")

    def __init__(self, text: str) -> None:
        data = text.encode()
        self.buffer = ctypes.create_string_buffer(data)
        self.address, self.size = ctypes.addressof(self.buffer), len(data)


class HandleArray:
    """A C array of handles (e.g. ``PJRT_Device**``) with a stable address."""
    __slots__ = ("array", "address", "count")

    def __init__(self, items: list[int]) -> None:
        self.array = array_type(ctypes.c_void_p, max(len(items), 1))(*items)
        self.address, self.count = ctypes.addressof(self.array), len(items)
