"""Buffers of loop iterations, allocated once before the loop.

A packing buffer (a matmul's A block and B panels, 512 KiB each) is allocated in each
iteration of the parallel loop that runs the cores' tiles: malloc maps such a buffer afresh
and the kernel zeroes its pages on first touch, or not, as glibc's trimming of its heap
decides, so the kernel's speed changed from one process to the next. Here
(``hoist_iteration_buffers``, with ``options.arena``, before the arena is planned) every
such alloc becomes a view of its iteration's slot in one buffer allocated before the loop.
Then every buffer that one iteration of a sequential loop (``scf.for``, a while loop's
body) allocates and frees is allocated once around the loop, out to the function's top
level, where the arena places it like any other: a scan of 128 steps made hundreds of
mallocs per call, a matmul's panels under a loop mapped and zeroed their pages each step.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, memref

from polyblocks_jax.options import Options
from polyblocks_jax.cpu.arena import ALIGNMENT, escapes, slot_bytes
from polyblocks_jax.cpu.parallel import dim_trips, loop_bounds
from polyblocks_jax.passes.shared_layers import PREFIX as LAYER_PREFIX
from polyblocks_jax.passes.transform import constant_index, defined_functions, walk

# Smaller buffers of a parallel loop come from malloc's caches, which keep their pages.
_MIN_BYTES = 64 << 10
_SEQUENTIAL = ("scf.for", "scf.while")


def hoist_iteration_buffers(module: ir.Module, options: Options, threads: int) -> None:
    """Give the large allocs inside the parallel loops of ``main`` and of the shared layers
    (whose bodies the arena later sees in main) of at most ``threads`` iterations (one per
    thread: a matmul's tiles), at the top level or in sequential loops, one slot per
    iteration; then allocate the buffers of sequential loops' iterations before the loops.
    A parallel loop of more iterations keeps its allocs: its slots would hold more buffers
    than are ever in use."""
    if not options.arena:
        return
    for fn in defined_functions(module):
        if fn.name.value == "main" or fn.name.value.startswith(LAYER_PREFIX):
            for loop in [op for op in walk(fn.operation) if op.name == "scf.parallel" and _in_sequence(op, fn)]:
                iterations = _iterations(loop)
                if iterations is not None and 0 < iterations <= threads:
                    _hoist(loop, iterations)
            _hoist_out_of_sequential_loops(fn.operation)


def _in_sequence(op: ir.Operation, fn: ir.OpView) -> bool:
    """Whether only sequential loops lie between ``op`` and ``fn``'s body."""
    parent = op.parent
    while parent != fn.operation:
        if parent.name not in _SEQUENTIAL:
            return False
        parent = parent.parent
    return True


def _hoist_out_of_sequential_loops(fn: ir.Operation) -> None:
    """Move each static alloc that one iteration of a sequential loop frees in its own block
    before the loop, its free after it; again from the enclosing loop, until none moves."""
    moved = True
    while moved:
        moved = False
        for alloc in [op for op in walk(fn) if op.name == "memref.alloc"]:
            loop = alloc.parent
            deallocs = _iteration_deallocs(alloc)
            if loop.name in _SEQUENTIAL and slot_bytes(alloc) and deallocs:
                alloc.move_before(loop)
                for dealloc in deallocs:
                    dealloc.move_after(loop)
                moved = True


def _iterations(loop: ir.Operation) -> int | None:
    """The iterations of an ``scf.parallel`` of constant bounds (``dim_trips`` counts 1 for
    an unknown dim: a slot per iteration needs them all); None for any other op."""
    known = all(constant_index(v) is not None for bounds in loop_bounds(loop) for v in bounds) \
        if loop.name == "scf.parallel" else False
    return math.prod(dim_trips(loop)) if known else None


def _hoist(loop: ir.Operation, iterations: int) -> None:
    """Slots for the ``iterations`` of ``loop``'s hoistable allocs, freed after the loop."""
    sizes = {}
    for alloc in walk(loop):
        size = slot_bytes(alloc) if alloc.name == "memref.alloc" else None
        if size and size >= _MIN_BYTES and _freed_in_its_block(alloc):
            sizes[alloc] = size
    if not sizes:
        return
    iteration = _iteration_index(loop, iterations)
    i8, index = ir.IntegerType.get_signless(8), ir.IndexType.get()
    for alloc, size in sizes.items():
        with ir.InsertionPoint(loop), loop.location:
            slots = memref.AllocOp(ir.MemRefType.get([iterations * size], i8), [], [],
                                   alignment=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ALIGNMENT))
        with ir.InsertionPoint.after(loop), loop.location:
            memref.DeallocOp(slots.result)
        with ir.InsertionPoint(alloc), alloc.location:
            offset = arith.MulIOp(iteration, arith.ConstantOp(index, size).result).result
            view = memref.ViewOp(alloc.result.type, slots.result, offset, [])
        for dealloc in [use.owner.operation for use in alloc.result.uses if use.owner.name == "memref.dealloc"]:
            dealloc.erase()
        alloc.result.replace_all_uses_with(view.result)
        alloc.erase()


def _freed_in_its_block(alloc: ir.Operation) -> bool:
    """Freed in its own block, and used nowhere it could escape from: its iteration's alone."""
    users = [use.owner.operation for use in alloc.result.uses]
    deallocs = [u for u in users if u.name == "memref.dealloc"]
    return bool(deallocs) and all(d.block == alloc.block for d in deallocs) and not any(map(escapes, users))


def _iteration_deallocs(alloc: ir.Operation) -> list[ir.Operation]:
    """The frees of ``alloc`` where it and its views are its block's alone: freed there, and
    used nowhere they could escape from (none where it is freed elsewhere or escapes)."""
    deallocs, pending = [], [alloc.result]
    while pending:
        value = pending.pop()
        for use in value.uses:
            user = use.owner.operation
            if user.name == "memref.dealloc":
                if value != alloc.result or user.block != alloc.block:
                    return []
                deallocs.append(user)
            elif escapes(user):
                return []
            else:
                pending.extend(r for r in user.results if isinstance(r.type, (ir.MemRefType, ir.UnrankedMemRefType)))
    return deallocs


def _iteration_index(loop: ir.Operation, iterations: int) -> ir.Value:
    """The row-major number of the iteration, computed first in ``loop``'s body."""
    body = loop.regions[0].blocks[0]
    index = ir.IndexType.get()
    with ir.InsertionPoint.at_block_begin(body), loop.location:
        linear, stride = arith.ConstantOp(index, 0).result, iterations
        for iv, (lb, _, step), trips in zip(body.arguments, loop_bounds(loop), dim_trips(loop)):
            stride //= trips
            number = arith.DivUIOp(arith.SubIOp(iv, lb).result, step).result
            term = arith.MulIOp(number, arith.ConstantOp(index, stride).result).result
            linear = arith.AddIOp(linear, term).result
    return linear
