"""Large host arrays recycled: a call's results take the memory of earlier results that are gone.

malloc serves a large array from a fresh mapping or from its heap, as its mmap threshold
and heap trimming decide from one moment to the next; a fresh mapping is faulted in page by
page by the kernel that first writes it. A program writing a new large result each call then
runs at a speed that changes from one process to the next.
Here an array is a view of a pooled block through a ``_Lease``; once every array made from
the lease is gone, the block goes back to the pool (at most ``_IDLE_BYTES`` idle, the oldest
dropped first), its pages still mapped. Large results are then not faulted in
on every call.
"""
from __future__ import annotations

import collections
import ctypes
import threading

import numpy as np

ALIGNMENT = 64
# Smaller arrays come from malloc's bins, which keep their pages.
MIN_BYTES = 1 << 20
_IDLE_BYTES = 256 << 20


def data_address(array: np.ndarray) -> int:
    """The address of ``array``'s data, read on every call: a writable array's through a
    ctypes view of its buffer, in a third of the time of numpy's ``ctypes.data`` (0.35
    against 1.0 us); any other's through ``ctypes.data``."""
    if array.flags.writeable:
        try:
            return ctypes.addressof(ctypes.c_char.from_buffer(array))
        except (TypeError, ValueError):  # not C-contiguous, or empty
            pass
    return array.ctypes.data


def aligned_bytes(nbytes: int) -> np.ndarray:
    """A new uninitialized uint8 array of ``nbytes`` whose data starts on a 64-byte boundary."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -data_address(raw) % ALIGNMENT
    return raw[start:start + nbytes]


class _Pool:
    def __init__(self, idle_bytes: int) -> None:
        self.idle_bytes = idle_bytes
        self._idle: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # id -> block
        # Reentrant: a lease can die (and give its block back) in a collection that an
        # allocation inside ``take`` set off, on the same thread.
        self._lock = threading.RLock()
        self._held = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A 64-byte aligned block of ``nbytes``: the idle one of that size given back last
        (the likeliest still in cache), else a new one."""
        with self._lock:
            for key, block in reversed(self._idle.items()):
                if block.nbytes == nbytes:
                    del self._idle[key]
                    self._held -= nbytes
                    return block
        return aligned_bytes(nbytes)

    def give_back(self, block: np.ndarray) -> None:
        with self._lock:
            self._idle[id(block)] = block
            self._held += block.nbytes
            while self._held > self.idle_bytes:
                _, oldest = self._idle.popitem(last=False)
                self._held -= oldest.nbytes


class _Lease:
    """A pooled block lent to the arrays made from it (their numpy base): back to the pool
    when the last of them is gone."""

    def __init__(self, block: np.ndarray, pool: _Pool) -> None:
        self._block, self._pool = block, pool
        self.__array_interface__ = {"shape": (block.nbytes,), "typestr": "|u1", "version": 3,
                                    "data": (data_address(block), False)}

    def __del__(self) -> None:
        self._pool.give_back(self._block)


_POOL = _Pool(_IDLE_BYTES)


def lent_bytes(nbytes: int) -> np.ndarray:
    """A 64-byte aligned uint8 array of ``nbytes`` (at least ``MIN_BYTES``), uninitialized,
    whose memory returns to the pool once it and every view of it are gone."""
    return np.asarray(_Lease(_POOL.take(nbytes), _POOL))
