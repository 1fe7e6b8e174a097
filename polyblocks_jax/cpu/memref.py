"""MLIR memref descriptors as ctypes structures, and 64-byte aligned host arrays.

A ranked memref crosses the C interface as {allocated, aligned, offset, sizes[r],
strides[r]}. One structure class per rank is made once and reused.
"""
from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from polyblocks_jax.cpu import array_pool
from polyblocks_jax.dtypes import TensorSpec


@functools.cache
def descriptor_class(rank: int) -> type[ctypes.Structure]:
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


class DescriptorFactory:
    """Builds descriptors of one static spec; only the data pointer changes per call."""

    def __init__(self, spec: TensorSpec) -> None:
        spec = spec.real_layout()  # the compiled code's view of a complex tensor
        self.cls = descriptor_class(spec.rank)
        self.sizes = spec.shape
        self.strides = contiguous_strides(spec.shape)

    def __call__(self, address: int) -> ctypes.Structure:
        if self.sizes:
            return self.cls(address, address, 0, self.sizes, self.strides)
        return self.cls(address, address, 0)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary (a large
    one's memory recycled, see array_pool.py)."""
    nbytes = math.prod(shape) * dtype.itemsize  # math.prod: a tenth of np.prod's call overhead
    pooled = nbytes >= array_pool.MIN_BYTES
    block = array_pool.lent_bytes(nbytes) if pooled else array_pool.aligned_bytes(nbytes)
    return block.view(dtype).reshape(shape)
