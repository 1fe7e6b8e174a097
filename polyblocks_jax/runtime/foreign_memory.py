"""Memory at an address and C arrays of any length, seen from Python without garbage cycles.

A ctypes array type (``c_char * n``) is a class, and a class is a reference cycle; ctypes
keeps one only while something uses it. Making one per call left cyclic garbage per call
for the collector (JAX's test that a jitted call leaves none failed on it). numpy views
memory through ``__array_interface__`` instead, and the array types of counts are cached.
"""
from __future__ import annotations

import functools

import numpy as np


class _Memory:
    """``nbytes`` bytes at ``address``, as numpy reads them; the base of every view of them,
    so that a ``weakref.finalize`` on it runs once none is left."""
    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def bytes_at(address: int, nbytes: int) -> np.ndarray:
    """The ``nbytes`` bytes at ``address`` as a writable uint8 array (``.base``: the object
    that lives as long as any view of them)."""
    return np.asarray(_Memory(address, nbytes))


@functools.lru_cache(maxsize=1024)
def array_type(ctype: type, count: int) -> type:
    """``ctype * count``, made once per count while it is among the last 1024 used."""
    return ctype * count
