"""Intermediate buffers larger than the memory this process may use, rejected at compile time.

Compiled code allocates its intermediates with malloc and does not check the result: a
buffer that cannot be had is a NULL store, a segfault that ends the process. Every shape
is static, so a buffer that can never fit is known before running: it becomes a
ResourceExhaustedError (PJRT: RESOURCE_EXHAUSTED). Buffers that fit one by one but not
all together still fail at run time.
"""
from __future__ import annotations

import math
import os
import resource

from mlir import ir

from polyblocks_jax.errors import ResourceExhaustedError
from polyblocks_jax.options import Options

_GIB = float(1 << 30)


def check_heap_buffers(module: ir.Module, options: Options) -> None:
    """Raise ResourceExhaustedError if one memref.alloc is larger than ``memory_limit()``."""
    buffers: list[ir.MemRefType] = []

    def visit(op: ir.Operation) -> ir.WalkResult:  # the native walk: models have 10^4 ops
        if op.name == "memref.alloc" and ir.MemRefType(op.result.type).has_static_shape:
            buffers.append(ir.MemRefType(op.result.type))
        return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
    largest = max(buffers, key=_bytes, default=None)
    if largest is not None and _bytes(largest) > (limit := memory_limit()):
        raise ResourceExhaustedError(
            f"an intermediate buffer {largest} needs {_bytes(largest) / _GIB:.1f} GiB; this process "
            f"may allocate {limit / _GIB:.1f} GiB more (physical memory, RLIMIT_AS, RLIMIT_DATA)")


def memory_limit() -> int:
    """Bytes this process may still allocate: physical memory, or less under an rlimit on
    its address space or data (less what it maps already)."""
    limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for kind in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, _ = resource.getrlimit(kind)
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft - _mapped_bytes())
    return max(limit, 0)


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _bytes(type_: ir.MemRefType) -> int:
    return math.prod(type_.shape) * _element_bytes(type_.element_type)


def _element_bytes(elem: ir.Type) -> int:
    if isinstance(elem, ir.VectorType):
        return math.prod(ir.VectorType(elem).shape) * _element_bytes(ir.VectorType(elem).element_type)
    if isinstance(elem, ir.IndexType):
        return 8
    return max(1, elem.width // 8)  # IntegerType and FloatType
