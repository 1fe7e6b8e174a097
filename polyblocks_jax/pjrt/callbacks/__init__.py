"""PJRT C API functions implemented in Python, one module per object kind.

``@implements("PJRT_Foo")`` registers ``fn(args)``, where ``args`` is the function's
``PJRT_Foo_Args`` structure; ``api.build_table`` wraps each one so that an exception
becomes a PJRT_Error and never escapes into jaxlib.
"""
from __future__ import annotations

import ctypes
from typing import Callable

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.runtime.foreign_memory import array_type

IMPLEMENTATIONS: dict[str, tuple[type[ctypes.Structure], Callable]] = {}


def implements(name: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        IMPLEMENTATIONS[name] = (getattr(abi, f"{name}_Args"), fn)
        return fn
    return register


def has_field(args: ctypes.Structure, name: str) -> bool:
    """Whether the caller's (possibly older, shorter) structure contains field ``name``."""
    field = getattr(type(args), name)
    return args.struct_size >= field.offset + field.size


def pointer_array(address: int, count: int) -> list[int | None]:
    return list(array_type(ctypes.c_void_p, count).from_address(address)) if count else []
