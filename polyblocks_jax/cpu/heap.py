"""Intermediate buffers larger than the memory this process may use, rejected at compile time.

Compiled code allocates the intermediates left outside the arena (cpu/arena.py) with
malloc and does not check the result: a buffer that cannot be had is a NULL store, a
segfault that ends the process. Every shape is static, so memory that can never be had is
known before running: one buffer too large, or the buffers alive at once (the arena, the
other top-level buffers, freed only at the end, and the largest buffer inside a loop)
together too large. Either becomes a ResourceExhaustedError (PJRT: RESOURCE_EXHAUSTED).
The arena itself is allocated, checked, by the runtime.
"""
from __future__ import annotations

import os
import resource

from mlir import ir

from polyblocks_jax.errors import ResourceExhaustedError
from polyblocks_jax.options import Options
from polyblocks_jax.cpu.arena import arena_bytes, buffer_bytes
from polyblocks_jax.passes.transform import walk

_GIB = float(1 << 30)


def check_heap_buffers(module: ir.Module, options: Options) -> bool:
    """Raise ResourceExhaustedError if one intermediate buffer (an alloc or a view of the
    arena), or those alive at once, exceed ``memory_limit()``. A check: False, the module as
    it was."""
    buffers: list[tuple[ir.MemRefType, int, str]] = []  # type, bytes, where: arena | top | nested
    for op in walk(module.operation):
        if op.name in ("memref.alloc", "memref.view") and ir.MemRefType(op.result.type).has_static_shape:
            type_ = ir.MemRefType(op.result.type)
            size = buffer_bytes(type_) or 0
            where = "arena" if op.name == "memref.view" else "top" if op.parent.operation.name == "func.func" \
                else "nested"
            buffers.append((type_, size, where))
    limit = memory_limit()
    largest = max(buffers, key=lambda b: b[1], default=None)
    if largest is not None and largest[1] > limit:
        raise ResourceExhaustedError(
            f"an intermediate buffer {largest[0]} needs {largest[1] / _GIB:.1f} GiB; this process "
            f"may allocate {limit / _GIB:.1f} GiB more (physical memory, RLIMIT_AS, RLIMIT_DATA)")
    arena = arena_bytes(module)
    together = arena + sum(size for _, size, where in buffers if where == "top") + \
        max((size for _, size, where in buffers if where == "nested"), default=0)
    if together > limit:
        raise ResourceExhaustedError(
            f"the intermediate buffers alive at once need {together / _GIB:.1f} GiB (arena "
            f"{arena / _GIB:.1f} GiB); this process may allocate {limit / _GIB:.1f} GiB more "
            "(physical memory, RLIMIT_AS, RLIMIT_DATA)")
    return False


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
